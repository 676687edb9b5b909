package vps

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const snapshotColumns = `s.id::text, s.tenant_id, s.name, s.instance_id::text, s.status, s.status_detail, s.created_by, s.created_at, s.deleted_at`

func scanSnapshot(row pgx.Row) (Snapshot, error) {
	var s Snapshot
	err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.SandboxID, &s.Status, &s.StatusDetail, &s.CreatedBy, &s.CreatedAt, &s.DeletedAt)
	return s, err
}

func getSnapshot(ctx context.Context, q postgres.Querier, id string) (Snapshot, error) {
	s, err := scanSnapshot(q.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM compute.vps_snapshots s WHERE s.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return s, api.NotFound("snapshot", id)
	}
	return s, err
}

// snapshotTarget finds a snapshot by its id.
func snapshotTarget(ctx context.Context, l modules.Lookup, in SnapshotRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "snapshot", Ref: in.Snapshot}
	err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.vps_snapshots WHERE id::text = $1`, in.Snapshot).Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("snapshot", in.Snapshot)
	}
	return t, err
}

// liveSandbox locks a sandbox that has not ended, for a change of its snapshots.
func liveSandbox(ctx context.Context, tx pgx.Tx, id string) (Instance, error) {
	i, err := scanInstance(tx.QueryRow(ctx, `SELECT `+instanceColumns+instanceFrom+` WHERE i.id = $1 FOR UPDATE OF i`, id))
	if err != nil {
		return i, err
	}
	if i.DeletedAt != nil {
		return i, api.Errorf(api.CodeFailedPrecondition, "sandbox %s has ended", i.Name).With("reason", "deleted")
	}
	return i, nil
}

func (m *Module) registerSnapshots(r *modules.Registry) {
	modules.Handle(r, SandboxSnapshotsCreate, func(ctx context.Context, l modules.Lookup, in CreateSnapshot) (modules.Target, error) {
		return sandboxTarget(ctx, l, in.SandboxRef)
	}, func(ctx context.Context, c *modules.Call, in CreateSnapshot) (Snapshot, error) {
		i, err := liveSandbox(ctx, c.Tx, c.Target.ResourceID)
		if err != nil {
			return Snapshot{}, err
		}
		if i.Power == PowerStopped {
			return Snapshot{}, api.Errorf(api.CodeFailedPrecondition, "sandbox %s is stopped: only a running or paused one has memory to save", i.Name).With("reason", "stopped")
		}
		id := uuid.Must(uuid.NewV7()).String()
		_, err = c.Tx.Exec(ctx, `INSERT INTO compute.vps_snapshots (id, tenant_id, name, instance_id, created_by) VALUES ($1, $2, $3, $4, $5)`,
			id, i.TenantID, in.Name, i.ID, c.Principal.ID)
		if postgres.ErrorCode(err) == postgres.UniqueViolation {
			return Snapshot{}, api.Errorf(api.CodeConflict, "sandbox %s has a snapshot named %q", i.Name, in.Name).With("reason", "name_taken")
		}
		if err != nil {
			return Snapshot{}, err
		}
		if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, i.NodeID); err != nil {
			return Snapshot{}, err
		}
		return getSnapshot(ctx, c.Tx, id)
	})
	modules.Handle(r, SandboxSnapshotsList, func(ctx context.Context, l modules.Lookup, in ListSnapshots) (modules.Target, error) {
		return sandboxTarget(ctx, l, in.SandboxRef)
	}, func(ctx context.Context, c *modules.Call, in ListSnapshots) (api.Page[Snapshot], error) {
		after := ""
		if in.Cursor != "" {
			key, err := api.DecodeCursor("vp1", in.Cursor)
			if err != nil {
				return api.Page[Snapshot]{}, err
			}
			after = key
		}
		rows, err := c.Tx.Query(ctx, `SELECT `+snapshotColumns+` FROM compute.vps_snapshots s WHERE s.instance_id = $1 AND s.deleted_at IS NULL
			AND s.id::text > $2 ORDER BY s.id LIMIT $3`, c.Target.ResourceID, after, in.PageLimit()+1)
		if err != nil {
			return api.Page[Snapshot]{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Snapshot, error) { return scanSnapshot(r) })
		if err != nil {
			return api.Page[Snapshot]{}, err
		}
		return api.PageOf(items, in.PageLimit(), "vp1", func(s Snapshot) string { return s.ID }), nil
	})
	modules.Handle(r, SandboxSnapshotsRestore, snapshotTarget, func(ctx context.Context, c *modules.Call, in SnapshotRef) (Snapshot, error) {
		s, err := getSnapshot(ctx, c.Tx, c.Target.ResourceID)
		if err != nil {
			return s, err
		}
		i, err := liveSandbox(ctx, c.Tx, s.SandboxID)
		if err != nil {
			return s, err
		}
		if s.Status != "ready" {
			return s, api.Errorf(api.CodeFailedPrecondition, "snapshot %s is %s: only a ready one restores", s.Name, s.Status).With("reason", "not_ready")
		}
		if _, err := c.Tx.Exec(ctx, `UPDATE compute.vps_instances SET restore_snapshot = $2, restores = restores + 1 WHERE id = $1`, i.ID, s.ID); err != nil {
			return s, err
		}
		return s, c.Runtime.Nodes.BumpDesired(ctx, c.Tx, i.NodeID)
	})
	modules.Handle(r, SandboxSnapshotsDelete, snapshotTarget, func(ctx context.Context, c *modules.Call, in SnapshotRef) (Snapshot, error) {
		s, err := getSnapshot(ctx, c.Tx, c.Target.ResourceID)
		if err != nil || s.DeletedAt != nil {
			return s, err
		}
		var node string
		if err := c.Tx.QueryRow(ctx, `UPDATE compute.vps_snapshots s SET deleted_at = compute.compute_now(), status = 'deleted'
			FROM compute.vps_instances i WHERE s.id = $1 AND i.id = s.instance_id RETURNING i.node_id::text`, s.ID).Scan(&node); err != nil {
			return s, err
		}
		if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, node); err != nil {
			return s, err
		}
		return getSnapshot(ctx, c.Tx, s.ID)
	})
}
