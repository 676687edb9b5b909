// Package rollouts rolls releases of bcd out to pools: in waves no larger than the pool's
// disruption budget, each gated on its nodes coming back online on the new release within a
// deadline, paused or rolled back when one does not. A node learns the release it should run
// from the desired-state part bcd.release (optional: an older bcd ignores it), which its bcd
// installs from the signed release repository (internal/core/releases, bcd/internal/selfupdate).
// Each rollout is advanced by a River job that looks again every few seconds (docs/releases.md).
package rollouts

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/releases"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the rollouts' schema.
var Migrations = postgres.EmbeddedMigrations("rollouts", "compute", migrationsFS)

// Queue is the River queue of the jobs that advance rollouts.
const Queue = "rollouts"

// DefaultPoll is how often a rollout in flight looks at its nodes.
const DefaultPoll = 2 * time.Second

// The events of rollouts; the subject of each is the rollout.
const (
	EventCreated       = "rollout.created"
	EventWaveStarted   = "rollout.wave_started"
	EventWaveSucceeded = "rollout.wave_succeeded"
	EventWaveFailed    = "rollout.wave_failed"
	EventPaused        = "rollout.paused"
	EventResumed       = "rollout.resumed"
	EventSucceeded     = "rollout.succeeded"
	EventRollingBack   = "rollout.rolling_back"
	EventRolledBack    = "rollout.rolled_back"
	EventFailed        = "rollout.failed"
)

// Module is rollouts. Poll is how often a rollout in flight looks at its nodes (DefaultPoll
// when zero).
type Module struct{ Poll time.Duration }

// Name implements modules.Module.
func (Module) Name() string { return "rollouts" }

// Register implements modules.Module.
func (m Module) Register(r *modules.Registry) error {
	poll := m.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceRollout, Description: "A release of bcd rolled out to a pool's nodes in waves."})
	r.Actions(modules.ActionsFor(api.RolloutMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventCreated, Description: "A rollout of a release to a pool was created (data: pool, release, nodes, maxUnavailable)."},
		modules.EventType{Name: EventWaveStarted, Description: "A wave of a rollout started: its nodes were told the release (data: wave, nodes, deadline)."},
		modules.EventType{Name: EventWaveSucceeded, Description: "A wave's nodes all came back online on the release (data: wave)."},
		modules.EventType{Name: EventWaveFailed, Description: "A wave's deadline passed before some of its nodes came back on the release (data: wave, nodes)."},
		modules.EventType{Name: EventPaused, Description: "A rollout was paused, by a call or by a failed wave (data: reason)."},
		modules.EventType{Name: EventResumed, Description: "A paused rollout was resumed (data: by)."},
		modules.EventType{Name: EventSucceeded, Description: "Every node of a rollout is on its release."},
		modules.EventType{Name: EventRollingBack, Description: "A rollout's nodes are being sent back to their releases of before (data: reason)."},
		modules.EventType{Name: EventRolledBack, Description: "A rollout's nodes are back on their releases of before."},
		modules.EventType{Name: EventFailed, Description: "A rollback's nodes did not come back on their releases of before in time (data: error)."},
	)
	r.DesiredKind(modules.DesiredKind{Name: api.BCDReleaseKind, Version: api.BCDReleaseVersion, Optional: true, State: nodeRelease})
	r.JobQueue(modules.JobQueue{Name: Queue, MaxWorkers: 4, AddWorkers: func(w *river.Workers, rt *modules.Runtime) error {
		return river.AddWorkerSafely(w, &advancer{rt: rt, poll: poll})
	}})
	modules.Handle(r, api.RolloutsCreate, nil, create)
	modules.Handle(r, api.RolloutsGet, rolloutTarget, func(ctx context.Context, c *modules.Call, in api.RolloutRef) (api.Rollout, error) {
		return read(ctx, c.Tx, in.Rollout, c.Target.TenantID, true)
	})
	modules.Handle(r, api.RolloutsList, nil, list)
	modules.Handle(r, api.RolloutsPause, rolloutTarget, pause)
	modules.Handle(r, api.RolloutsResume, rolloutTarget, resume)
	modules.Handle(r, api.RolloutsRollback, rolloutTarget, rollback)
	return nil
}

// nodeRelease is a node's bcd.release part: the release rollouts told it, or nil.
func nodeRelease(ctx context.Context, q postgres.Querier, node string) (any, error) {
	var r api.BCDRelease
	var rollout *string
	err := q.QueryRow(ctx, `SELECT version, rollout_id::text, attempt FROM compute.node_releases WHERE node_id = $1`, node).Scan(&r.Version, &rollout, &r.Attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rollout != nil {
		r.Rollout = *rollout
	}
	return r, nil
}

func rolloutTarget(ctx context.Context, l modules.Lookup, in api.RolloutRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "rollout", Ref: in.Rollout, ResourceID: in.Rollout}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.rollouts WHERE id = $1`, in.Rollout).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("rollout", in.Rollout)
	}
	return t, err
}

// advanceArgs is the job that advances a rollout, of the rollout's generation when enqueued.
type advanceArgs struct {
	Rollout    string `json:"rollout"`
	Generation int64  `json:"generation"`
}

func (advanceArgs) Kind() string { return "rollout.advance" }

func (advanceArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: 100}
}

func enqueue(ctx context.Context, c *modules.Call, id string, generation int64) error {
	_, err := c.Runtime.Jobs.InsertTx(ctx, c.Tx, advanceArgs{Rollout: id, Generation: generation}, nil)
	return err
}

func create(ctx context.Context, c *modules.Call, in api.CreateRollout) (api.Rollout, error) {
	pool, err := fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
	if err != nil {
		return api.Rollout{}, err
	}
	rel, err := releases.Get(ctx, c.Tx, in.Release)
	if err != nil {
		return api.Rollout{}, err
	}
	rows, err := c.Tx.Query(ctx, `SELECT id::text, name, coalesce(facts->>'arch', '') FROM compute.nodes
		WHERE pool_id = $1 AND state <> 'retired' AND role = 'node' ORDER BY name`, pool)
	if err != nil {
		return api.Rollout{}, err
	}
	type node struct{ id, name, arch string }
	nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (node, error) {
		var n node
		return n, r.Scan(&n.id, &n.name, &n.arch)
	})
	if err != nil {
		return api.Rollout{}, err
	}
	if len(nodes) == 0 {
		return api.Rollout{}, api.Errorf(api.CodeFailedPrecondition, "pool %s has no nodes to roll %s out to", in.Pool, in.Release).With("reason", "no_nodes")
	}
	// A node whose platform the release has no build for could never come back on it.
	for _, n := range nodes {
		if n.arch != "" && !hasBuild(rel, "linux", n.arch) {
			return api.Rollout{}, api.Errorf(api.CodeFailedPrecondition, "release %s has no build for node %s (linux/%s): publish one first", in.Release, n.name, n.arch).
				With("reason", "no_build").With("node", n.name)
		}
	}
	id := uuid.Must(uuid.NewV7()).String()
	maxUnavailable := max(in.MaxUnavailable, 1)
	onFailure := in.OnFailure
	if onFailure == "" {
		onFailure = api.OnFailurePause
	}
	_, err = c.Tx.Exec(ctx, `INSERT INTO compute.rollouts (id, tenant_id, pool_id, release, max_unavailable, wave_deadline, on_failure, created_by)
		VALUES ($1, $2, $3, $4, $5, make_interval(secs => $6), $7, $8)`,
		id, c.Target.TenantID, pool, in.Release, maxUnavailable, in.Deadline().Seconds(), onFailure, c.Principal.ID)
	if postgres.ErrorCode(err) == postgres.UniqueViolation {
		var other string
		_ = c.Tx.QueryRow(ctx, `SELECT id::text FROM compute.rollouts WHERE pool_id = $1 AND state IN ('running', 'paused', 'rolling_back')`, pool).Scan(&other)
		return api.Rollout{}, api.Errorf(api.CodeConflict, "pool %s has a rollout that has not finished (%s): let it finish, or roll it back", in.Pool, other).
			With("reason", "rollout_in_progress").With("rollout", other)
	}
	if err != nil {
		return api.Rollout{}, err
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
	}
	if _, err := c.Tx.Exec(ctx, `INSERT INTO compute.rollout_nodes (rollout_id, node_id) SELECT $1, unnest($2::uuid[])`, id, ids); err != nil {
		return api.Rollout{}, err
	}
	if err := enqueue(ctx, c, id, 1); err != nil {
		return api.Rollout{}, err
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventCreated, TenantID: c.Target.TenantID, Subject: id,
		Data: map[string]any{"pool": pool, "release": in.Release, "nodes": len(nodes), "maxUnavailable": maxUnavailable}}); err != nil {
		return api.Rollout{}, err
	}
	return read(ctx, c.Tx, id, c.Target.TenantID, true)
}

func hasBuild(r api.Release, goos, arch string) bool {
	for _, b := range r.Builds {
		if b.OS == goos && b.Arch == arch {
			return true
		}
	}
	return false
}

// lockRollout reads a rollout's state and generation for update, in the caller's tenant.
func lockRollout(ctx context.Context, tx pgx.Tx, id, tenant string) (state string, generation int64, err error) {
	err = tx.QueryRow(ctx, `SELECT state, generation FROM compute.rollouts WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenant).Scan(&state, &generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, api.NotFound("rollout", id)
	}
	return state, generation, err
}

func notNow(id, state, what string) error {
	return api.Errorf(api.CodeFailedPrecondition, "rollout %s is %s: it cannot be %s", id, state, what).With("reason", "state").With("state", state)
}

func pause(ctx context.Context, c *modules.Call, in api.RolloutRef) (api.Rollout, error) {
	state, _, err := lockRollout(ctx, c.Tx, in.Rollout, c.Target.TenantID)
	if err != nil {
		return api.Rollout{}, err
	}
	if state != api.RolloutRunning {
		return api.Rollout{}, notNow(in.Rollout, state, "paused")
	}
	reason := "paused by " + c.Principal.ID
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'paused', generation = generation + 1, note = $2, updated_at = compute.compute_now()
		WHERE id = $1`, in.Rollout, reason); err != nil {
		return api.Rollout{}, err
	}
	if err := emit(ctx, c.Tx, c.Runtime, c.Target.TenantID, in.Rollout, EventPaused, map[string]any{"reason": reason}); err != nil {
		return api.Rollout{}, err
	}
	return read(ctx, c.Tx, in.Rollout, c.Target.TenantID, true)
}

// resume runs a paused rollout again. A wave it stopped in gets a new deadline; a failed wave's
// nodes are tried again, as a new try (a node does not install again a release it rolled back
// in the same try).
func resume(ctx context.Context, c *modules.Call, in api.RolloutRef) (api.Rollout, error) {
	state, generation, err := lockRollout(ctx, c.Tx, in.Rollout, c.Target.TenantID)
	if err != nil {
		return api.Rollout{}, err
	}
	if state != api.RolloutPaused {
		return api.Rollout{}, notNow(in.Rollout, state, "resumed")
	}
	rows, err := c.Tx.Query(ctx, `UPDATE compute.rollout_nodes rn SET state = 'updating', attempts = attempts + 1
		FROM compute.rollouts r WHERE r.id = rn.rollout_id AND rn.rollout_id = $1 AND rn.wave = r.wave AND rn.state = 'failed'
		RETURNING rn.node_id::text`, in.Rollout)
	if err != nil {
		return api.Rollout{}, err
	}
	retried, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return api.Rollout{}, err
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.node_releases nr SET attempt = rn.attempts, updated_at = compute.compute_now()
		FROM compute.rollout_nodes rn WHERE rn.rollout_id = $1 AND rn.node_id = nr.node_id AND nr.rollout_id = $1 AND rn.node_id = ANY($2::uuid[])`,
		in.Rollout, retried); err != nil {
		return api.Rollout{}, err
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.rollout_waves w SET state = 'running', finished_at = NULL,
		deadline = compute.compute_now() + r.wave_deadline
		FROM compute.rollouts r WHERE r.id = w.rollout_id AND w.rollout_id = $1 AND w.n = r.wave AND (w.state = 'running' OR $2)`,
		in.Rollout, len(retried) > 0); err != nil {
		return api.Rollout{}, err
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'running', generation = generation + 1, note = '', error = '',
		updated_at = compute.compute_now() WHERE id = $1`, in.Rollout); err != nil {
		return api.Rollout{}, err
	}
	if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, retried...); err != nil {
		return api.Rollout{}, err
	}
	if err := enqueue(ctx, c, in.Rollout, generation+1); err != nil {
		return api.Rollout{}, err
	}
	if err := emit(ctx, c.Tx, c.Runtime, c.Target.TenantID, in.Rollout, EventResumed, map[string]any{"by": c.Principal.ID, "retried": len(retried)}); err != nil {
		return api.Rollout{}, err
	}
	return read(ctx, c.Tx, in.Rollout, c.Target.TenantID, true)
}

func rollback(ctx context.Context, c *modules.Call, in api.RolloutRef) (api.Rollout, error) {
	state, generation, err := lockRollout(ctx, c.Tx, in.Rollout, c.Target.TenantID)
	if err != nil {
		return api.Rollout{}, err
	}
	switch state {
	case api.RolloutRunning, api.RolloutPaused, api.RolloutSucceeded:
	default:
		return api.Rollout{}, notNow(in.Rollout, state, "rolled back")
	}
	if err := startRollback(ctx, c.Tx, c.Runtime, c.Target.TenantID, in.Rollout, "rolled back by "+c.Principal.ID); err != nil {
		return api.Rollout{}, err
	}
	if err := enqueue(ctx, c, in.Rollout, generation+1); err != nil {
		return api.Rollout{}, err
	}
	return read(ctx, c.Tx, in.Rollout, c.Target.TenantID, true)
}

func emit(ctx context.Context, q postgres.Querier, rt *modules.Runtime, tenant, rollout, typ string, data map[string]any) error {
	return rt.Events.Emit(ctx, q, modules.Event{Type: typ, TenantID: tenant, Subject: rollout, Data: data})
}

// startRollback sends every node the rollout told its release back to the release it ran
// before (a node with none known, or none published, keeps what it runs), skips the nodes it
// never reached, and moves the generation (the caller enqueues the job of the next one). The
// caller holds the rollout's row lock.
func startRollback(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, tenant, id, reason string) error {
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes SET state = 'skipped' WHERE rollout_id = $1 AND state = 'pending'`, id); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_waves SET state = 'failed', finished_at = compute.compute_now() WHERE rollout_id = $1 AND state = 'running'`, id); err != nil {
		return err
	}
	// Nodes with a published release to return to are told it, as a new try.
	rows, err := tx.Query(ctx, `UPDATE compute.rollout_nodes rn SET state = 'reverting', attempts = attempts + 1
		WHERE rn.rollout_id = $1 AND rn.state IN ('updating', 'updated', 'failed')
		  AND EXISTS (SELECT 1 FROM compute.releases r WHERE r.version = rn.previous_version)
		RETURNING rn.node_id::text, rn.previous_version, rn.attempts`, id)
	if err != nil {
		return err
	}
	type revert struct {
		node, version string
		attempt       int
	}
	reverts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (revert, error) {
		var v revert
		return v, r.Scan(&v.node, &v.version, &v.attempt)
	})
	if err != nil {
		return err
	}
	nodes := make([]string, len(reverts))
	for i, r := range reverts {
		nodes[i] = r.node
		if _, err := tx.Exec(ctx, `INSERT INTO compute.node_releases (node_id, version, rollout_id, attempt) VALUES ($1, $2, $3, $4)
			ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, rollout_id = excluded.rollout_id, attempt = excluded.attempt, updated_at = compute.compute_now()`,
			r.node, r.version, id, r.attempt); err != nil {
			return err
		}
	}
	// The others are no longer told this rollout's release: they keep what they run.
	rows, err = tx.Query(ctx, `DELETE FROM compute.node_releases nr USING compute.rollout_nodes rn
		WHERE nr.node_id = rn.node_id AND rn.rollout_id = $1 AND nr.rollout_id = $1 AND rn.state IN ('updating', 'updated', 'failed')
		RETURNING nr.node_id::text`, id)
	if err != nil {
		return err
	}
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	note := ""
	if len(kept) > 0 {
		note = fmt.Sprintf("%d nodes have no published release of before to return to: they keep what they run", len(kept))
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'rolling_back', generation = generation + 1, error = $2, note = $3,
		rollback_deadline = compute.compute_now() + wave_deadline, updated_at = compute.compute_now() WHERE id = $1`, id, reason, note); err != nil {
		return err
	}
	if err := rt.Nodes.BumpDesired(ctx, tx, append(nodes, kept...)...); err != nil {
		return err
	}
	return emit(ctx, tx, rt, tenant, id, EventRollingBack, map[string]any{"reason": reason, "reverting": len(nodes), "kept": len(kept)})
}
