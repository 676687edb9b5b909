package capacity

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// refreshSQL recomputes the rollups of the nodes $1 from their devices and the bookings that
// hold something now, under the rollups' locks, which it takes first, in node order. The recount
// is compute.refresh_node_capacity (migrations 00011 and 00013), where the reasons for its order
// and its clock are written: a trigger on compute.nodes calls it too, for the nodes whose state,
// status, health or pool a statement changed, so a write of node rows needs no refresh of its own.
const refreshSQL = `SELECT compute.refresh_node_capacity($1::uuid[])`

// lockSQL takes the rollup rows of nodes, in a fixed order, for a transaction that changes their
// bookings or devices before it recounts them (refreshSQL, in a later statement, whose snapshot
// then includes every change of the transactions that held the lock before).
const lockSQL = `SELECT node_id FROM compute.node_capacity WHERE node_id = ANY($1::uuid[]) ORDER BY node_id FOR UPDATE`

// stampSQL marks the rollup rows of nodes $1 as written by this transaction (node_capacity.changed)
// when what a placer reads of them changed though every count may be equal: devices (a GPU failing
// as another recovers, a new NVLink topology, a mode), bookings that start later, their
// cancellation, an extension. A pool lease holder learns from the mark that its memory of the node
// is stale (docs/capacity.md, "The pool lease"). The caller holds the rows' locks.
const stampSQL = `UPDATE compute.node_capacity SET changed = pg_catalog.pg_current_xact_id() WHERE node_id = ANY($1::uuid[])`

// leaseRollupSQL recounts the whole-GPU columns of the rollups $1 (gpus_free, gpus_spot) from a
// pool lease holder's memory of the nodes instead of their tables: their whole, healthy GPUs ($2,
// $3) and their GPU bookings ($4–$9: node, atoms, start, end or NULL, spot), the placements of
// the write included. It counts as compute.refresh_node_capacity does, and as of the same
// instant, once the rows' locks are held (the override of compute.now, or the clock), never the
// transaction's start: a release that committed after this transaction began has cut its
// booking at its own, later, start, which memory read again. Memory is exact there: the lease
// check (leaseLockSQL), earlier in the write, holds the rows' locks and found each at a version
// memory includes, and every change to what is counted writes or marks the row (refreshSQL when
// a count changes, stampSQL otherwise). Its placements change nothing else of a rollup (whole
// GPUs, no preemption). Drift and the tests' recounts check it.
const leaseRollupSQL = `
WITH t AS (
  SELECT coalesce(nullif(pg_catalog.current_setting('compute.now', true), '')::timestamptz, pg_catalog.clock_timestamp()) AS as_of
), h AS (
  SELECT h.n, int4range(h.lo, h.hi) AS atoms, h.spot
  FROM unnest($4::uuid[], $5::int[], $6::int[], $7::timestamptz[], $8::timestamptz[], $9::bool[]) AS h(n, lo, hi, s, e, spot), t
  WHERE h.s <= t.as_of AND (h.e IS NULL OR h.e > t.as_of)
), g AS (
  SELECT g.n,
    EXISTS (SELECT 1 FROM h WHERE h.n = g.n AND NOT h.spot AND h.atoms && int4range(g.i * 64, g.i * 64 + 64)) AS held,
    EXISTS (SELECT 1 FROM h WHERE h.n = g.n AND h.spot AND h.atoms && int4range(g.i * 64, g.i * 64 + 64)) AS spot_held
  FROM unnest($2::uuid[], $3::int[]) AS g(n, i)
), c AS (
  SELECT u.n, count(g.n) FILTER (WHERE NOT g.held AND NOT g.spot_held) AS free, count(g.n) FILTER (WHERE NOT g.held AND g.spot_held) AS spot
  FROM unnest($1::uuid[]) AS u(n) LEFT JOIN g ON g.n = u.n GROUP BY u.n
)
UPDATE compute.node_capacity nc SET gpus_free = c.free, gpus_spot = c.spot, changed = pg_catalog.pg_current_xact_id()
FROM c WHERE nc.node_id = c.n`

// queueLeaseRollups queues leaseRollupSQL for nodes, memory's copies of them.
func queueLeaseRollups(b *pgx.Batch, nodes []NodeSnapshot) {
	var ids, gpuNodes, holdNodes []string
	var gpus, lo, hi []int32
	var from []time.Time
	var to []*time.Time
	var spot []bool
	for _, n := range nodes {
		ids = append(ids, n.NodeID)
		for _, g := range n.GPUs {
			if g.Mode == api.GPUModeWhole && g.Healthy {
				gpuNodes, gpus = append(gpuNodes, n.NodeID), append(gpus, int32(g.Index))
			}
		}
		for _, h := range n.Held {
			if h.Resource == "gpu" {
				holdNodes, lo, hi = append(holdNodes, n.NodeID), append(lo, int32(h.Span.Lo)), append(hi, int32(h.Span.Hi))
				from, to, spot = append(from, h.From), append(to, h.To), append(spot, h.Spot)
			}
		}
	}
	b.Queue(leaseRollupSQL, ids, gpuNodes, gpus, holdNodes, lo, hi, from, to, spot)
}

// refreshStamped is RefreshNodes, then stampSQL: for the writers of devices.
func refreshStamped(ctx context.Context, q postgres.Querier, nodeIDs ...string) error {
	if err := RefreshNodes(ctx, q, nodeIDs...); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, stampSQL, nodeIDs); err != nil {
		return fmt.Errorf("capacity: mark the rollups of %d nodes changed: %w", len(nodeIDs), err)
	}
	return nil
}

// RefreshNodes recomputes the rollups of nodes, in the caller's transaction.
func RefreshNodes(ctx context.Context, q postgres.Querier, nodeIDs ...string) error {
	if len(nodeIDs) == 0 {
		return nil
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
