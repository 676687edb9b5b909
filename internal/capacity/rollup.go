package capacity

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// refreshSQL recomputes the rollups of the nodes $1 from their devices and the bookings that
// hold something now. It is a recount, never a delta: a rollup is exact after every statement
// that writes it, however stale it was before (a booking that ended while no worker had ticked
// yet, a concurrent change). Each node's bookings are read through the exclusion constraint's
// index, so it is cheap enough to run in every transaction that changes the node.
//
// It counts as of this statement, not of its transaction's start (compute_now() without a test
// clock): a transaction that began before a booking's end and waited for the node's lock behind
// the worker's tick for that end would otherwise recount the ended booking as held, after the
// tick, and no later change would correct it.
const refreshSQL = `
INSERT INTO compute.node_capacity AS nc (node_id, pool_id, schedulable, gpu_model, gpus_total, gpus_free, gpus_spot, mig_gpus, ts_gpus,
  vcpus_total, vcpus_used, vcpus_spot, memory_total, memory_used, memory_spot)
SELECT n.id, n.pool_id, n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy',
  g.model, g.total, g.free, g.spot, g.mig, g.ts,
  coalesce(r.vcpus, 0), least(u.vcpus_used, coalesce(r.vcpus, 0)), least(u.vcpus_spot, greatest(coalesce(r.vcpus, 0) - u.vcpus_used, 0)),
  coalesce(r.memory_gib, 0), least(u.memory_used, coalesce(r.memory_gib, 0)), least(u.memory_spot, greatest(coalesce(r.memory_gib, 0) - u.memory_used, 0))
FROM (SELECT coalesce(nullif(pg_catalog.current_setting('compute.now', true), '')::timestamptz, pg_catalog.statement_timestamp()) AS now) t
CROSS JOIN compute.nodes n
LEFT JOIN compute.node_resources r ON r.node_id = n.id
CROSS JOIN LATERAL (
  SELECT coalesce(CASE WHEN count(DISTINCT d.model) FILTER (WHERE d.whole) > 1 THEN 'mixed' ELSE min(d.model) FILTER (WHERE d.whole) END, '') AS model,
    count(*) FILTER (WHERE d.whole) AS total,
    count(*) FILTER (WHERE d.whole AND NOT d.held AND NOT d.spot_held) AS free,
    count(*) FILTER (WHERE d.whole AND NOT d.held AND d.spot_held) AS spot,
    count(*) FILTER (WHERE d.mode = 'mig' AND d.ok) AS mig,
    count(*) FILTER (WHERE d.mode = 'timeslice' AND d.ok) AS ts
  FROM (
    SELECT d.model, d.mode, d.health <> 'unhealthy' AS ok, d.mode = 'whole' AND d.health <> 'unhealthy' AS whole,
      EXISTS (SELECT 1 FROM compute.bookings b WHERE b.node_id = n.id AND b.resource = 'gpu' AND NOT b.spot
        AND b.atoms && int4range(d.index * 64, d.index * 64 + 64) AND b.during @> t.now) AS held,
      EXISTS (SELECT 1 FROM compute.bookings b WHERE b.node_id = n.id AND b.resource = 'gpu' AND b.spot
        AND b.atoms && int4range(d.index * 64, d.index * 64 + 64) AND b.during @> t.now) AS spot_held
    FROM compute.devices d WHERE d.node_id = n.id
  ) d
) g
CROSS JOIN LATERAL (
  SELECT
    coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND NOT b.spot), 0) AS vcpus_used,
    coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND b.spot), 0) AS vcpus_spot,
    coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND NOT b.spot), 0) AS memory_used,
    coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND b.spot), 0) AS memory_spot
  FROM compute.bookings b WHERE b.node_id = n.id AND b.resource IN ('cpu', 'memory') AND b.during @> t.now
) u
WHERE n.id = ANY($1::uuid[])
ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id, schedulable = excluded.schedulable, gpu_model = excluded.gpu_model,
  gpus_total = excluded.gpus_total, gpus_free = excluded.gpus_free, gpus_spot = excluded.gpus_spot,
  mig_gpus = excluded.mig_gpus, ts_gpus = excluded.ts_gpus,
  vcpus_total = excluded.vcpus_total, vcpus_used = excluded.vcpus_used, vcpus_spot = excluded.vcpus_spot,
  memory_total = excluded.memory_total, memory_used = excluded.memory_used, memory_spot = excluded.memory_spot`

// lockSQL takes the rollup rows of nodes, in a fixed order. Every transaction that changes a
// node's bookings refreshes its rollup under this lock, in a later statement than the one that
// took it: under READ COMMITTED that statement's snapshot then includes every other change to the
// node, whose transactions held the lock before us. Computing first and locking second would let
// a concurrent booking's count be overwritten.
const lockSQL = `SELECT node_id FROM compute.node_capacity WHERE node_id = ANY($1::uuid[]) ORDER BY node_id FOR UPDATE`

// RefreshNodes recomputes the rollups of nodes, in the caller's transaction.
func RefreshNodes(ctx context.Context, q postgres.Querier, nodeIDs ...string) error {
	if len(nodeIDs) == 0 {
		return nil
	}
	if _, err := q.Exec(ctx, lockSQL, nodeIDs); err != nil {
		return fmt.Errorf("capacity: lock rollups: %w", err)
	}
	if _, err := q.Exec(ctx, refreshSQL, nodeIDs); err != nil {
		return fmt.Errorf("capacity: refresh the rollups of %d nodes: %w", len(nodeIDs), err)
	}
	return nil
}

// NodeDrift is a node whose rollup disagrees with a recount of its bookings.
type NodeDrift struct {
	NodeID, Rollup, Recount string
}

func (d NodeDrift) String() string {
	return fmt.Sprintf("node %s: the rollup says %s; its bookings say %s", d.NodeID, d.Rollup, d.Recount)
}

// Drift recounts every node's rollup from its devices and the bookings that hold something now,
// in SQL of its own (not refreshSQL's), and returns the nodes where the two differ. A rollup is
// exact after each change to its node and each edge the worker applies; between an edge (a
// booking's start or end) and the worker's next tick it may still count the booking. It reads
// every booking that holds now: a check for tests and operators, not for a hot path.
func Drift(ctx context.Context, q postgres.Querier) ([]NodeDrift, error) {
	rows, err := q.Query(ctx, recountSQL)
	if err != nil {
		return nil, fmt.Errorf("capacity: recount rollups: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[NodeDrift])
}

// recountSQL: see Drift.
const recountSQL = `
WITH now AS (SELECT compute.compute_now() AS t),
held AS (
  SELECT d.node_id, d.mode, d.health <> 'unhealthy' AS ok,
    EXISTS (SELECT 1 FROM compute.bookings b, now WHERE b.node_id = d.node_id AND b.resource = 'gpu' AND NOT b.spot
      AND b.during @> now.t AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)) AS normal,
    EXISTS (SELECT 1 FROM compute.bookings b, now WHERE b.node_id = d.node_id AND b.resource = 'gpu' AND b.spot
      AND b.during @> now.t AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)) AS spot
  FROM compute.devices d
),
want AS (
  SELECT nc.node_id,
    (SELECT count(*) FROM held h WHERE h.node_id = nc.node_id AND h.mode = 'whole' AND h.ok) AS total,
    (SELECT count(*) FROM held h WHERE h.node_id = nc.node_id AND h.mode = 'whole' AND h.ok AND NOT h.normal AND NOT h.spot) AS free,
    (SELECT count(*) FROM held h WHERE h.node_id = nc.node_id AND h.mode = 'whole' AND h.ok AND NOT h.normal AND h.spot) AS spot,
    (SELECT count(*) FROM held h WHERE h.node_id = nc.node_id AND h.mode = 'mig' AND h.ok) AS mig,
    (SELECT count(*) FROM held h WHERE h.node_id = nc.node_id AND h.mode = 'timeslice' AND h.ok) AS ts,
    (SELECT coalesce(sum(upper(atoms) - lower(atoms)), 0) FROM compute.bookings b, now WHERE b.node_id = nc.node_id
      AND b.resource = 'cpu' AND NOT b.spot AND b.during @> now.t) AS vcpus,
    (SELECT coalesce(sum(upper(atoms) - lower(atoms)), 0) FROM compute.bookings b, now WHERE b.node_id = nc.node_id
      AND b.resource = 'memory' AND NOT b.spot AND b.during @> now.t) AS mem
  FROM compute.node_capacity nc
)
SELECT nc.node_id::text,
  format('total %s free %s spot %s mig %s ts %s vcpus %s mem %s', nc.gpus_total, nc.gpus_free, nc.gpus_spot, nc.mig_gpus, nc.ts_gpus, nc.vcpus_used, nc.memory_used),
  format('total %s free %s spot %s mig %s ts %s vcpus %s mem %s', w.total, w.free, w.spot, w.mig, w.ts, w.vcpus, w.mem)
FROM compute.node_capacity nc JOIN want w USING (node_id)
WHERE (nc.gpus_total, nc.gpus_free, nc.gpus_spot, nc.mig_gpus, nc.ts_gpus, nc.vcpus_used, nc.memory_used)
  <> (w.total, w.free, w.spot, w.mig, w.ts, w.vcpus, w.mem)`
