package rollouts

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const rolloutColumns = `r.id::text, r.tenant_id, r.pool_id::text, r.release, r.max_unavailable, extract(epoch FROM r.wave_deadline)::float8,
	r.on_failure, r.state, r.wave, r.note, r.error, r.created_by, r.created_at, r.updated_at, r.finished_at,
	(SELECT count(*) FROM compute.rollout_nodes rn WHERE rn.rollout_id = r.id),
	(SELECT count(*) FROM compute.rollout_nodes rn WHERE rn.rollout_id = r.id AND rn.state = 'updated')`

func scanRollout(row pgx.Row) (api.Rollout, error) {
	var r api.Rollout
	var secs float64
	err := row.Scan(&r.ID, &r.TenantID, &r.PoolID, &r.Release, &r.MaxUnavailable, &secs, &r.OnFailure, &r.State, &r.Wave, &r.Note, &r.Error,
		&r.CreatedBy, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt, &r.Total, &r.Updated)
	r.WaveDeadline = time.Duration(secs * float64(time.Second)).String()
	r.Waves, r.Nodes = []api.RolloutWave{}, []api.RolloutNode{}
	return r, err
}

// read returns a rollout of tenant, with its waves and nodes when details is set.
func read(ctx context.Context, q postgres.Querier, id, tenant string, details bool) (api.Rollout, error) {
	r, err := scanRollout(q.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM compute.rollouts r WHERE r.id = $1 AND r.tenant_id = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, api.NotFound("rollout", id)
	}
	if err != nil || !details {
		return r, err
	}
	rows, err := q.Query(ctx, `SELECT w.n, w.state, w.started_at, w.deadline, w.finished_at,
		coalesce((SELECT array_agg(n.name ORDER BY n.name) FROM compute.rollout_nodes rn JOIN compute.nodes n ON n.id = rn.node_id
		          WHERE rn.rollout_id = w.rollout_id AND rn.wave = w.n), '{}')
		FROM compute.rollout_waves w WHERE w.rollout_id = $1 ORDER BY w.n`, id)
	if err != nil {
		return r, err
	}
	if r.Waves, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.RolloutWave, error) {
		var w api.RolloutWave
		return w, row.Scan(&w.Number, &w.State, &w.StartedAt, &w.Deadline, &w.FinishedAt, &w.Nodes)
	}); err != nil {
		return r, err
	}
	rows, err = q.Query(ctx, `SELECT rn.node_id::text, n.name, rn.wave, rn.state, rn.previous_version, coalesce(s.agent_version, ''),
		n.status = 'online', rn.attempts
		FROM compute.rollout_nodes rn JOIN compute.nodes n ON n.id = rn.node_id LEFT JOIN compute.node_sessions s ON s.node_id = rn.node_id
		WHERE rn.rollout_id = $1 ORDER BY rn.wave = 0, rn.wave, n.name`, id)
	if err != nil {
		return r, err
	}
	r.Nodes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.RolloutNode, error) {
		var n api.RolloutNode
		return n, row.Scan(&n.NodeID, &n.Name, &n.Wave, &n.State, &n.PreviousVersion, &n.Version, &n.Online, &n.Attempts)
	})
	return r, err
}

const cursorKind = "ro1"

func list(ctx context.Context, c *modules.Call, in api.ListRollouts) (api.Page[api.Rollout], error) {
	var after, pool *string
	if in.Cursor != "" {
		key, err := api.DecodeIDCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.Rollout]{}, err
		}
		after = &key
	}
	if in.Pool != "" {
		id, err := fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
		if err != nil {
			return api.Page[api.Rollout]{}, err
		}
		pool = &id
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+rolloutColumns+` FROM compute.rollouts r
		WHERE r.tenant_id = $1 AND ($2::uuid IS NULL OR r.id < $2) AND ($3::uuid IS NULL OR r.pool_id = $3) AND ($4 = '' OR r.state = $4)
		ORDER BY r.id DESC LIMIT $5`, c.Target.TenantID, after, pool, in.State, limit+1)
	if err != nil {
		return api.Page[api.Rollout]{}, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.Rollout, error) { return scanRollout(row) })
	if err != nil {
		return api.Page[api.Rollout]{}, err
	}
	return api.PageOf(items, limit, cursorKind, func(r api.Rollout) string { return r.ID }), nil
}
