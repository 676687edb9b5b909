package capacity

import (
	"context"
	"fmt"

	"github.com/better-compute/compute/postgres"
)

// refreshSQL recomputes one node's rollup from its devices and the bookings that hold something
// now. It touches only that node's rows (the bookings through the exclusion constraint's index),
// so it is cheap enough to run in every transaction that changes the node.
const refreshSQL = `
WITH t AS (SELECT compute.compute_now() AS now),
b AS (
  SELECT resource, atoms, spot FROM compute.bookings, t
  WHERE node_id = $1 AND during @> t.now
),
g AS (
  SELECT d.model, d.mode, d.health <> 'unhealthy' AS ok,
    EXISTS (SELECT 1 FROM b WHERE b.resource = 'gpu' AND NOT b.spot AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)) AS held,
    EXISTS (SELECT 1 FROM b WHERE b.resource = 'gpu' AND b.spot AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)) AS spot_held
  FROM compute.devices d WHERE d.node_id = $1
),
u AS (
  SELECT
    coalesce(sum(upper(atoms) - lower(atoms)) FILTER (WHERE resource = 'cpu' AND NOT spot), 0) AS vcpus_used,
    coalesce(sum(upper(atoms) - lower(atoms)) FILTER (WHERE resource = 'cpu' AND spot), 0) AS vcpus_spot,
    coalesce(sum(upper(atoms) - lower(atoms)) FILTER (WHERE resource = 'memory' AND NOT spot), 0) AS memory_used,
    coalesce(sum(upper(atoms) - lower(atoms)) FILTER (WHERE resource = 'memory' AND spot), 0) AS memory_spot
  FROM b
)
INSERT INTO compute.node_capacity AS nc (node_id, pool_id, schedulable, gpu_model, gpus_total, gpus_free, gpus_spot, mig_gpus, ts_gpus,
  vcpus_total, vcpus_used, vcpus_spot, memory_total, memory_used, memory_spot)
SELECT n.id, n.pool_id, n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy',
  coalesce((SELECT CASE WHEN count(DISTINCT model) > 1 THEN 'mixed' ELSE min(model) END FROM g WHERE mode = 'whole' AND ok), ''),
  (SELECT count(*) FROM g WHERE mode = 'whole' AND ok),
  (SELECT count(*) FROM g WHERE mode = 'whole' AND ok AND NOT held AND NOT spot_held),
  (SELECT count(*) FROM g WHERE mode = 'whole' AND ok AND NOT held AND spot_held),
  (SELECT count(*) FROM g WHERE mode = 'mig' AND ok),
  (SELECT count(*) FROM g WHERE mode = 'timeslice' AND ok),
  coalesce(r.vcpus, 0), least(u.vcpus_used, coalesce(r.vcpus, 0)), least(u.vcpus_spot, greatest(coalesce(r.vcpus, 0) - u.vcpus_used, 0)),
  coalesce(r.memory_gib, 0), least(u.memory_used, coalesce(r.memory_gib, 0)), least(u.memory_spot, greatest(coalesce(r.memory_gib, 0) - u.memory_used, 0))
FROM compute.nodes n LEFT JOIN compute.node_resources r ON r.node_id = n.id, u
WHERE n.id = $1
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
	for _, id := range nodeIDs {
		if _, err := q.Exec(ctx, refreshSQL, id); err != nil {
			return fmt.Errorf("capacity: refresh the rollup of node %s: %w", id, err)
		}
	}
	return nil
}

// takeSQL is the rollup change of a booking that starts now on atoms that were free: a placer
// that holds the node's lock and preempted nothing applies it instead of a full refresh.
const takeSQL = `UPDATE compute.node_capacity SET gpus_free = gpus_free - $2, vcpus_used = vcpus_used + $3, memory_used = memory_used + $4
WHERE node_id = $1`
