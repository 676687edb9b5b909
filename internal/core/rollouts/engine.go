package rollouts

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
)

// advancer works the job of a rollout: each attempt is one step, in one transaction under the
// rollout's row lock, and the job snoozes until the next look, until the rollout stops (paused,
// finished) or a newer generation's job takes over.
type advancer struct {
	river.WorkerDefaults[advanceArgs]
	rt   *modules.Runtime
	poll time.Duration
}

func (w *advancer) Timeout(*river.Job[advanceArgs]) time.Duration { return 30 * time.Second }

func (w *advancer) Work(ctx context.Context, j *river.Job[advanceArgs]) error {
	var again bool
	err := pgx.BeginFunc(ctx, w.rt.DB.Pool, func(tx pgx.Tx) error {
		var err error
		again, err = step(ctx, tx, w.rt, j.Args)
		return err
	})
	if err != nil {
		return err
	}
	if again {
		return river.JobSnooze(w.poll)
	}
	return nil
}

// rollout is what a step reads of its rollout.
type rollout struct {
	id, tenant, pool, release, onFailure, state string
	maxUnavailable, wave                        int
	generation                                  int64
	waveDeadline                                time.Duration
	rollbackDeadline                            *time.Time
	now                                         time.Time
}

// step advances a rollout once; again says whether its job should look again.
func step(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, a advanceArgs) (again bool, err error) {
	var r rollout
	var secs float64
	err = tx.QueryRow(ctx, `SELECT id::text, tenant_id, pool_id::text, release, on_failure, state, max_unavailable, wave, generation,
		extract(epoch FROM wave_deadline)::float8, rollback_deadline, compute.compute_now()
		FROM compute.rollouts WHERE id = $1 FOR UPDATE`, a.Rollout).
		Scan(&r.id, &r.tenant, &r.pool, &r.release, &r.onFailure, &r.state, &r.maxUnavailable, &r.wave, &r.generation, &secs, &r.rollbackDeadline, &r.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r.waveDeadline = time.Duration(secs * float64(time.Second))
	if r.generation != a.Generation {
		return false, nil // a pause, a resume or a rollback since: a newer job, or none, advances it
	}
	switch r.state {
	case api.RolloutRunning:
		return stepRunning(ctx, tx, rt, &r)
	case api.RolloutRollingBack:
		return stepRollingBack(ctx, tx, rt, &r)
	}
	return false, nil
}

// backOn marks the nodes of the rollout in state from that are online with their session's bcd
// reporting the version they were told (version, or for a rollback each one's release of
// before) as state to, and returns how many are still in state from, by name.
func backOn(ctx context.Context, tx pgx.Tx, r *rollout, from, to string) ([]string, error) {
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes rn SET state = $3
		FROM compute.nodes n, compute.node_sessions s
		WHERE rn.rollout_id = $1 AND rn.state = $2 AND n.id = rn.node_id AND s.node_id = rn.node_id
		  AND n.status = 'online' AND s.closed_at IS NULL
		  AND s.agent_version = CASE WHEN $2 = 'reverting' THEN rn.previous_version ELSE $4 END`,
		r.id, from, to, r.release); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT n.name FROM compute.rollout_nodes rn JOIN compute.nodes n ON n.id = rn.node_id
		WHERE rn.rollout_id = $1 AND rn.state = $2 ORDER BY n.name`, r.id, from)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func setNote(ctx context.Context, tx pgx.Tx, id, note string) error {
	_, err := tx.Exec(ctx, `UPDATE compute.rollouts SET note = $2, updated_at = CASE WHEN note = $2 THEN updated_at ELSE compute.compute_now() END WHERE id = $1`, id, note)
	return err
}

func stepRunning(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, r *rollout) (bool, error) {
	// A node retired since it was counted will not come back: it is no longer waited for.
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes rn SET state = 'skipped' FROM compute.nodes n
		WHERE rn.rollout_id = $1 AND n.id = rn.node_id AND n.state = 'retired' AND rn.state IN ('pending', 'updating')`, r.id); err != nil {
		return false, err
	}
	if r.wave > 0 {
		var state string
		var deadline time.Time
		if err := tx.QueryRow(ctx, `SELECT state, deadline FROM compute.rollout_waves WHERE rollout_id = $1 AND n = $2`, r.id, r.wave).Scan(&state, &deadline); err != nil {
			return false, err
		}
		if state == api.WaveRunning {
			waiting, err := backOn(ctx, tx, r, api.RolloutNodeUpdating, api.RolloutNodeUpdated)
			if err != nil {
				return false, err
			}
			if len(waiting) > 0 && r.now.Before(deadline) {
				return true, setNote(ctx, tx, r.id, fmt.Sprintf("wave %d: waiting for %s to come back online on %s, until %s",
					r.wave, names(waiting), r.release, deadline.UTC().Format(time.RFC3339)))
			}
			if len(waiting) > 0 {
				return waveFailed(ctx, tx, rt, r, waiting)
			}
			if _, err := tx.Exec(ctx, `UPDATE compute.rollout_waves SET state = 'succeeded', finished_at = compute.compute_now() WHERE rollout_id = $1 AND n = $2`, r.id, r.wave); err != nil {
				return false, err
			}
			if err := emit(ctx, tx, rt, r.tenant, r.id, EventWaveSucceeded, map[string]any{"wave": r.wave}); err != nil {
				return false, err
			}
		}
	}
	return nextWave(ctx, tx, rt, r)
}

// waveFailed fails the wave in flight: its nodes not back are failed, and the rollout pauses or
// rolls back.
func waveFailed(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, r *rollout, waiting []string) (bool, error) {
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes SET state = 'failed' WHERE rollout_id = $1 AND state = 'updating'`, r.id); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_waves SET state = 'failed', finished_at = compute.compute_now() WHERE rollout_id = $1 AND n = $2`, r.id, r.wave); err != nil {
		return false, err
	}
	if err := emit(ctx, tx, rt, r.tenant, r.id, EventWaveFailed, map[string]any{"wave": r.wave, "nodes": waiting}); err != nil {
		return false, err
	}
	reason := fmt.Sprintf("wave %d failed: %s did not come back online on %s within %s", r.wave, names(waiting), r.release, r.waveDeadline)
	if r.onFailure == api.OnFailureRollback {
		if err := startRollback(ctx, tx, rt, r.tenant, r.id, reason); err != nil {
			return false, err
		}
		// The rollback moved the generation: this job goes on as the new one's.
		_, err := rt.Jobs.InsertTx(ctx, tx, advanceArgs{Rollout: r.id, Generation: r.generation + 1}, nil)
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'paused', generation = generation + 1, error = $2, note = '',
		updated_at = compute.compute_now() WHERE id = $1`, r.id, reason); err != nil {
		return false, err
	}
	return false, emit(ctx, tx, rt, r.tenant, r.id, EventPaused, map[string]any{"reason": reason})
}

// nextWave starts the next wave within the pool's disruption budget, or finishes the rollout.
func nextWave(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, r *rollout) (bool, error) {
	// Online nodes first; a node offline now counts against the budget only if this rollout
	// has nothing to do with it.
	rows, err := tx.Query(ctx, `SELECT rn.node_id::text, n.name FROM compute.rollout_nodes rn JOIN compute.nodes n ON n.id = rn.node_id
		WHERE rn.rollout_id = $1 AND rn.state = 'pending' AND n.state <> 'retired' ORDER BY n.status = 'online' DESC, n.name`, r.id)
	if err != nil {
		return false, err
	}
	type node struct{ id, name string }
	pending, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (node, error) {
		var n node
		return n, row.Scan(&n.id, &n.name)
	})
	if err != nil {
		return false, err
	}
	if len(pending) == 0 {
		if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes SET state = 'skipped' WHERE rollout_id = $1 AND state = 'pending'`, r.id); err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'succeeded', note = '', finished_at = compute.compute_now(), updated_at = compute.compute_now() WHERE id = $1`, r.id); err != nil {
			return false, err
		}
		return false, emit(ctx, tx, rt, r.tenant, r.id, EventSucceeded, nil)
	}
	var unavailable int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM compute.nodes n WHERE n.pool_id = $1 AND n.state <> 'retired' AND n.role = 'node' AND n.status <> 'online'
		AND NOT EXISTS (SELECT 1 FROM compute.rollout_nodes rn WHERE rn.rollout_id = $2 AND rn.node_id = n.id AND rn.state = 'pending')`, r.pool, r.id).Scan(&unavailable); err != nil {
		return false, err
	}
	budget := r.maxUnavailable - unavailable
	if budget <= 0 {
		return true, setNote(ctx, tx, r.id, fmt.Sprintf("waiting: %d nodes of the pool are unavailable, the disruption budget (maxUnavailable) is %d", unavailable, r.maxUnavailable))
	}
	wave := pending[:min(budget, len(pending))]
	ids, named := make([]string, len(wave)), make([]string, len(wave))
	for i, n := range wave {
		ids[i], named[i] = n.id, n.name
	}
	r.wave++
	deadline := r.now.Add(r.waveDeadline)
	if _, err := tx.Exec(ctx, `INSERT INTO compute.rollout_waves (rollout_id, n, started_at, deadline) VALUES ($1, $2, compute.compute_now(), $3)`, r.id, r.wave, deadline); err != nil {
		return false, err
	}
	// Each node's release of before is what its bcd reports now.
	if _, err := tx.Exec(ctx, `UPDATE compute.rollout_nodes rn SET state = 'updating', wave = $2, attempts = attempts + 1,
		previous_version = coalesce((SELECT s.agent_version FROM compute.node_sessions s WHERE s.node_id = rn.node_id), '')
		WHERE rn.rollout_id = $1 AND rn.node_id = ANY($3::uuid[])`, r.id, r.wave, ids); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO compute.node_releases (node_id, version, rollout_id, attempt)
		SELECT rn.node_id, $2, $1, rn.attempts FROM compute.rollout_nodes rn WHERE rn.rollout_id = $1 AND rn.node_id = ANY($3::uuid[]) ORDER BY rn.node_id
		ON CONFLICT (node_id) DO UPDATE SET version = excluded.version, rollout_id = excluded.rollout_id, attempt = excluded.attempt, updated_at = compute.compute_now()`,
		r.id, r.release, ids); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET wave = $2, note = $3, updated_at = compute.compute_now() WHERE id = $1`,
		r.id, r.wave, fmt.Sprintf("wave %d: %s told to run %s", r.wave, names(named), r.release)); err != nil {
		return false, err
	}
	if err := rt.Nodes.BumpDesired(ctx, tx, ids...); err != nil {
		return false, err
	}
	return true, emit(ctx, tx, rt, r.tenant, r.id, EventWaveStarted, map[string]any{"wave": r.wave, "nodes": named, "deadline": deadline.UTC().Format(time.RFC3339)})
}

func stepRollingBack(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, r *rollout) (bool, error) {
	waiting, err := backOn(ctx, tx, r, api.RolloutNodeReverting, api.RolloutNodeReverted)
	if err != nil {
		return false, err
	}
	if len(waiting) == 0 {
		if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'rolled_back', finished_at = compute.compute_now(), updated_at = compute.compute_now() WHERE id = $1`, r.id); err != nil {
			return false, err
		}
		return false, emit(ctx, tx, rt, r.tenant, r.id, EventRolledBack, nil)
	}
	if r.rollbackDeadline == nil || r.now.Before(*r.rollbackDeadline) {
		return true, nil
	}
	msg := fmt.Sprintf("%s did not come back online on their releases of before within %s", names(waiting), r.waveDeadline)
	if _, err := tx.Exec(ctx, `UPDATE compute.rollouts SET state = 'failed', error = error || '; ' || $2, finished_at = compute.compute_now(),
		updated_at = compute.compute_now() WHERE id = $1`, r.id, msg); err != nil {
		return false, err
	}
	return false, emit(ctx, tx, rt, r.tenant, r.id, EventFailed, map[string]any{"error": msg})
}

// names names nodes for a note, the first few of many.
func names(ns []string) string {
	if len(ns) > 5 {
		return strings.Join(ns[:5], ", ") + fmt.Sprintf(" and %d more", len(ns)-5)
	}
	return strings.Join(ns, ", ")
}
