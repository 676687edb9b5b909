package vps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
)

// A VM host is a node whose bcd reported a runtime (vps.host, kept in compute.vps_hosts). Its
// bcd also says whether the runtime answers: one that does not (libvirtd stopped, its socket
// refusing) makes the host no place for VMs until it answers again. Nothing is placed on it,
// none of its warm VMs is handed out, and what is booked on it is given up after a grace:
// warm VMs (no one's yet) after WarmLostAfter, replaced on another host by the next refill;
// instances and sandboxes after LostAfter, as lost. A warm VM on a host that went offline is
// replaced in the same way; the core keeps everyone else's bookings on an offline node.

// reasonLost begins the deleted reason of an instance or sandbox given up with its host.
const reasonLost = "lost"

// hostReported records a VM host's runtime and whether it answers. When it stops answering,
// vmhost.runtime_down is said and its tenants' instances and sandboxes are marked in error,
// each with its status event; when it answers again, vmhost.runtime_up, and its desired state
// is pushed again, since the convergence it was last sent failed.
func hostReported(ctx context.Context, r *modules.Report) error {
	var h hostapi.Host
	if err := json.Unmarshal(r.Payload, &h); err != nil || h.Runtime == "" || len(h.Runtime) > 64 {
		return api.InvalidField("runtime", "a vps.host report names its runtime")
	}
	why := clip(h.Unreachable, hostapi.MaxUnreachable)
	var was string
	known := true
	err := r.Tx.QueryRow(ctx, `SELECT unreachable FROM compute.vps_hosts WHERE node_id = $1 FOR UPDATE`, r.NodeID).Scan(&was)
	if errors.Is(err, pgx.ErrNoRows) {
		known = false
	} else if err != nil {
		return err
	}
	if _, err := r.Tx.Exec(ctx, `INSERT INTO compute.vps_hosts (node_id, runtime, unreachable, unreachable_since)
			VALUES ($1, $2, $3::text, CASE WHEN $3::text = '' THEN NULL ELSE compute.compute_now() END)
		ON CONFLICT (node_id) DO UPDATE SET runtime = EXCLUDED.runtime, reported_at = compute.compute_now(), unreachable = EXCLUDED.unreachable,
			unreachable_since = CASE WHEN EXCLUDED.unreachable = '' THEN NULL ELSE coalesce(vps_hosts.unreachable_since, EXCLUDED.unreachable_since) END`,
		r.NodeID, h.Runtime, why); err != nil {
		return err
	}
	down, wasDown := why != "", known && was != ""
	switch {
	case down && !wasDown:
		if err := r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: EventVMHostRuntimeDown, TenantID: r.TenantID, Subject: r.NodeID,
			Data: map[string]any{"runtime": h.Runtime, "detail": why}}); err != nil {
			return err
		}
		return markUnreachable(ctx, r)
	case !down && wasDown:
		if err := r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: EventVMHostRuntimeUp, TenantID: r.TenantID, Subject: r.NodeID,
			Data: map[string]any{"runtime": h.Runtime}}); err != nil {
			return err
		}
		return r.Runtime.Nodes.BumpDesired(ctx, r.Tx, r.NodeID)
	}
	return nil
}

// markUnreachable says, in the status of the live instances and sandboxes of the reporting host,
// that it cannot reach its runtime, with an event each: their owners hear of it before the grace
// runs out. Warm VMs are no one's: they wait for their own grace.
func markUnreachable(ctx context.Context, r *modules.Report) error {
	// Why is the host's (socket paths, its runtime's words): its operator's event has it, and its
	// tenants hear what happened.
	const detail = "its host cannot reach its VM runtime"
	rows, err := r.Tx.Query(ctx, `UPDATE compute.vps_instances SET status = 'error', status_detail = $2, status_at = compute.compute_now()
		WHERE node_id = $1 AND deleted_at IS NULL AND kind <> 'warm' AND (status <> 'error' OR status_detail <> $2)
		RETURNING id::text, tenant_id, name, kind`, r.NodeID, detail)
	if err != nil {
		return err
	}
	type marked struct{ id, tenant, name, kind string }
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (marked, error) {
		var m marked
		return m, row.Scan(&m.id, &m.tenant, &m.name, &m.kind)
	})
	if err != nil {
		return err
	}
	for _, m := range all {
		if err := r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: eventOf(m.kind, "status"), TenantID: m.tenant, Subject: m.id,
			Data: map[string]any{"name": m.name, "status": "error", "detail": detail}}); err != nil {
			return err
		}
	}
	return nil
}

// unreachableHosts are the VM hosts whose runtime does not answer: placements leave them out.
func unreachableHosts(ctx context.Context, q postgres.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT node_id::text FROM compute.vps_hosts WHERE unreachable <> '' ORDER BY node_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// unreachableConflict is the no-room answer of a placement that left out VM hosts whose runtime
// does not answer: it names those of the pool (the capacity's own diagnosis cannot know why
// they were left out, and may count their room).
func unreachableConflict(ctx context.Context, c *modules.Call, pool string, avoided []string, err error) error {
	var e *api.Error
	if !errors.As(err, &e) {
		return err
	}
	poolID, perr := c.Runtime.Fleet.PoolID(ctx, c.Tx, c.Target.TenantID, pool)
	if perr != nil {
		return err // another tenant's pool: its nodes are not this tenant's to name
	}
	rows, qerr := c.Tx.Query(ctx, `SELECT name FROM compute.nodes WHERE pool_id = $1 AND id = ANY($2::uuid[]) ORDER BY name`, poolID, avoided)
	if qerr != nil {
		return err
	}
	names, qerr := pgx.CollectRows(rows, pgx.RowTo[string])
	if qerr != nil || len(names) == 0 {
		return err
	}
	details := maps.Clone(e.Details)
	if details == nil {
		details = map[string]any{}
	}
	details["capacityReason"], details["reason"], details["unreachableVMHosts"] = details["reason"], "vm_host_unreachable", names
	return &api.Error{Code: e.Code, Details: details, Message: fmt.Sprintf("%s; VM hosts left out, their runtime not answering (vmhost.runtime_down): %s",
		e.Message, strings.Join(names, ", "))}
}

// lostSQL finds the live instances the host of which cannot serve them, with why: warm ones whose
// host has not reached its runtime, or been online, for $1; others whose host has not reached
// its runtime for $2. $3, when set, is the one instance to find, locked.
const lostSQL = `SELECT i.id::text, i.tenant_id, i.kind, coalesce(h.unreachable, '')
FROM compute.vps_instances i
LEFT JOIN compute.vps_hosts h ON h.node_id = i.node_id
LEFT JOIN compute.nodes n ON n.id = i.node_id
WHERE i.deleted_at IS NULL AND ($3::uuid IS NULL OR i.id = $3) AND (
	h.unreachable_since <= compute.compute_now() - CASE WHEN i.kind = 'warm' THEN $1::interval ELSE $2::interval END
	OR (i.kind = 'warm' AND n.status = 'offline' AND coalesce(n.last_seen_at, n.updated_at) <= compute.compute_now() - $1::interval))
ORDER BY i.id`

// lostWork is an instance to give up.
type lostWork struct{ id, tenant, kind, unreachable string }

// reason is its deleted reason.
func (w lostWork) reason(lostAfter time.Duration) string {
	switch {
	case w.kind == kindWarm && w.unreachable != "":
		return "its host cannot reach its VM runtime"
	case w.kind == kindWarm:
		return "its host is offline"
	}
	return clip(fmt.Sprintf("%s: its host could not reach its VM runtime for %s (%s)", reasonLost, lostAfter, w.unreachable), 1024)
}

// endLost gives up the work its host cannot serve (lostSQL): each instance ends in its own
// transaction, as the module in its tenant, its reservation released. A warm one's template
// books a replacement at its next refill, where there is room; a lost instance or sandbox is
// said with instance.lost or sandbox.lost.
func (m *Module) endLost(ctx context.Context, rt *modules.Runtime) error {
	scan := func(r pgx.CollectableRow) (lostWork, error) {
		var w lostWork
		return w, r.Scan(&w.id, &w.tenant, &w.kind, &w.unreachable)
	}
	rows, err := rt.DB.Pool.Query(ctx, lostSQL, m.opts.WarmLostAfter, m.opts.LostAfter, nil)
	if err != nil {
		return err
	}
	lost, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return err
	}
	var errs []error // one that cannot be ended now does not hold up the others
	for _, w := range lost {
		if err := asModule(ctx, rt, w.tenant, func(c *modules.Call) error {
			// Again, locked: the host may have come back, or a call ended it meanwhile.
			rows, err := c.Tx.Query(ctx, lostSQL+` FOR UPDATE OF i SKIP LOCKED`, m.opts.WarmLostAfter, m.opts.LostAfter, w.id)
			if err != nil {
				return err
			}
			still, err := pgx.CollectRows(rows, scan)
			if err != nil || len(still) == 0 {
				return err
			}
			rt.Logger.Info("vps: work given up with its host", "instance", w.id, "kind", w.kind, "reason", still[0].reason(m.opts.LostAfter))
			return endInstance(ctx, c, w.id, still[0].reason(m.opts.LostAfter))
		}); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs = append(errs, fmt.Errorf("vps: give up %s %s: %w", w.kind, w.id, err))
		}
	}
	return errors.Join(errs...)
}

// clip cuts s to at most n bytes of valid UTF-8.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
