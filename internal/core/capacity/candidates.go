package capacity

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
)

// candidate is a node a placer has locked: its rollup row, FOR UPDATE.
type candidate struct{ id, name string }

// candidateQuery picks and locks nodes that may fit a member, best first. skip passes over
// nodes another placer holds (SKIP LOCKED), so concurrent placers take different nodes; wait
// is the same query waiting for them, for a placer that found every candidate held.
type candidateQuery struct{ skip, wait string }

func locking(q string) candidateQuery {
	return candidateQuery{skip: q + "\nFOR UPDATE OF nc SKIP LOCKED", wait: q + "\nFOR UPDATE OF nc"}
}

// fitSQL is the common case, N whole GPUs now with no label filter: an index walk over the pool's
// schedulable nodes in best-fit order (fewest free GPUs first, so large free blocks stay whole),
// stopping at the first unlocked nodes that fit. The first %s is the model condition, the second
// the free-capacity condition, the third the order: one statement per case, not one with an OR or
// a CASE, so that a prepared statement's generic plan still walks the index in order and the
// free-capacity condition bounds the walk (an index condition) instead of filtering full nodes
// one by one.
const fitSQL = `
SELECT nc.node_id::text, n.name
FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id
WHERE nc.pool_id = @pool AND nc.schedulable AND %s AND %s
  AND NOT nc.node_id = ANY(coalesce(@exclude::uuid[], '{}'))
ORDER BY %s nc.gpus_free, nc.node_id
LIMIT @limit`

// The free-capacity conditions of fitSQL. A spot-holding node enters the second pass only
// (node_capacity_spot_fit, migration 00012, holds just those): without spot holders it had
// enough free GPUs for the first already.
const (
	fitFree = "nc.gpus_free >= @gpus"
	fitSpot = "nc.gpus_spot > 0 AND nc.gpus_free + nc.gpus_spot >= @gpus"
)

// filterSQL picks nodes that may fit a member, for every other case. On the "now" path it reads
// the rollups: nodes whose free GPUs suffice without preempting come first, then the tightest
// fit. A future window only has static filters; the exact check is the snapshot's.
const filterSQL = `
SELECT nc.node_id::text, n.name
FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id
WHERE nc.pool_id = @pool AND nc.schedulable
  AND n.labels @> @require
  AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(@avoid) a WHERE n.labels ->> a.key = a.value)
  AND NOT nc.node_id = ANY(coalesce(@exclude::uuid[], '{}'))
  AND CASE @kind::text
      WHEN 'gpu' THEN (@model = '' OR nc.gpu_model = @model OR nc.gpu_model = 'mixed') AND nc.gpus_total >= @gpus
        AND (NOT @now OR nc.gpus_free + CASE WHEN @spot_free THEN nc.gpus_spot ELSE 0 END >= @gpus)
      WHEN 'mig' THEN nc.mig_gpus > 0
      WHEN 'share' THEN nc.ts_gpus > 0
      ELSE true END
  AND nc.vcpus_total >= @vcpus AND nc.memory_total >= @memory
  AND (NOT @now OR (nc.vcpus_total - nc.vcpus_used - CASE WHEN @spot_free THEN 0 ELSE nc.vcpus_spot END >= @vcpus
                    AND nc.memory_total - nc.memory_used - CASE WHEN @spot_free THEN 0 ELSE nc.memory_spot END >= @memory))
ORDER BY
  CASE WHEN @now AND @kind = 'gpu' AND nc.gpus_free >= @gpus THEN 0 ELSE 1 END,
  CASE WHEN @now AND @kind = 'gpu' THEN nc.gpus_free ELSE 0 END,
  CASE WHEN @now THEN nc.vcpus_total - nc.vcpus_used ELSE 0 END,
  nc.node_id
LIMIT @limit`

var (
	fitModelQuery     = locking(fmt.Sprintf(fitSQL, "nc.gpu_model = @model", fitFree, "nc.gpu_model,"))
	fitAnyQuery       = locking(fmt.Sprintf(fitSQL, "@model = ''", fitFree, ""))
	fitModelSpotQuery = locking(fmt.Sprintf(fitSQL, "nc.gpu_model = @model", fitSpot, "nc.gpu_model,"))
	fitAnySpotQuery   = locking(fmt.Sprintf(fitSQL, "@model = ''", fitSpot, ""))
	filterQuery       = locking(filterSQL)
)

// candidateArgs are the named arguments of the candidate queries; each reads those it names.
type candidateArgs struct {
	Pool  string `db:"pool"`
	Model string `db:"model"` // "": any
	GPUs  int    `db:"gpus"`
	// SpotFree counts what spot bookings hold as free (filterSQL): a normal request may preempt them.
	SpotFree bool              `db:"spot_free"`
	VCPUs    int               `db:"vcpus"`
	Memory   int               `db:"memory"`
	Require  map[string]string `db:"require"`
	Avoid    map[string]string `db:"avoid"`
	Exclude  []string          `db:"exclude"` // nodes tried already
	Now      bool              `db:"now"`     // the window starts now: the rollups count
	Kind     string            `db:"kind"`    // shapeKind
	Limit    int               `db:"limit"`
}

// fitQuery is the index walk for whole GPUs of model, or of any model; spot counts what spot
// bookings hold as free, for a normal request that may preempt them.
func fitQuery(model string, spot bool) candidateQuery {
	switch {
	case model != "" && spot:
		return fitModelSpotQuery
	case model != "":
		return fitModelQuery
	case spot:
		return fitAnySpotQuery
	}
	return fitAnyQuery
}

// ExplainCandidates answers the plan, with ANALYZE, of the candidate query that places gpus whole
// GPUs of model in pool now, for benchmarks and tests. It locks the node it finds, in tx.
func ExplainCandidates(ctx context.Context, tx pgx.Tx, pool, model string, gpus int) ([]string, error) {
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+fitQuery(model, false).skip,
		pgx.StructArgs(candidateArgs{Pool: pool, Model: model, GPUs: gpus, Limit: 1}))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// lockCandidates runs a candidate query and returns the nodes it locked, best first.
func lockCandidates(ctx context.Context, tx pgx.Tx, sql string, args candidateArgs) ([]candidate, error) {
	rows, err := tx.Query(ctx, sql, pgx.StructArgs(args))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		return c, r.Scan(&c.id, &c.name)
	})
}

func shapeKind(s api.Shape) string {
	switch {
	case s.GPUs > 0:
		return "gpu"
	case s.MIGProfile != "":
		return "mig"
	case s.TimeSlice:
		return "share"
	}
	return ""
}

// loadSnapshots reads locked nodes' devices, resources and the bookings that overlap w, in one
// round trip.
func loadSnapshots(ctx context.Context, tx pgx.Tx, cands []candidate, w window) ([]NodeSnapshot, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	b := &pgx.Batch{}
	snaps := queueSnapshots(b, cands, w)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("capacity: read the snapshots of %d nodes: %w", len(cands), err)
	}
	return snaps, nil
}

// queueSnapshots queues in b the reads of loadSnapshots; the snapshots are filled in once b has
// run.
func queueSnapshots(b *pgx.Batch, cands []candidate, w window) []NodeSnapshot {
	if len(cands) == 0 {
		return nil
	}
	ids := make([]string, len(cands))
	index := make(map[string]int, len(cands))
	snaps := make([]NodeSnapshot, len(cands))
	for i, c := range cands {
		ids[i], index[c.id] = c.id, i
		snaps[i] = NodeSnapshot{NodeID: c.id, Name: c.name}
	}
	b.Queue(`SELECT node_id::text, index, uuid, model, nvlink_domain, mode, shares, health <> 'unhealthy' FROM compute.devices
		WHERE node_id = ANY($1::uuid[]) ORDER BY node_id, index`, ids).Query(func(rows pgx.Rows) error {
		var node string
		var g GPUState
		_, err := pgx.ForEachRow(rows, []any{&node, &g.Index, &g.UUID, &g.Model, &g.Domain, &g.Mode, &g.Shares, &g.Healthy}, func() error {
			snaps[index[node]].GPUs = append(snaps[index[node]].GPUs, g)
			return nil
		})
		return err
	})
	b.Queue(`SELECT node_id::text, vcpus, memory_gib FROM compute.node_resources WHERE node_id = ANY($1::uuid[])`, ids).
		Query(func(rows pgx.Rows) error {
			var node string
			var vcpus, mem int
			_, err := pgx.ForEachRow(rows, []any{&node, &vcpus, &mem}, func() error {
				snaps[index[node]].VCPUs, snaps[index[node]].MemoryGiB = vcpus, mem
				return nil
			})
			return err
		})
	b.Queue(`SELECT node_id::text, resource, lower(atoms), upper(atoms), spot, reservation_id::text, lower(during), upper(during)
		FROM compute.bookings WHERE node_id = ANY($1::uuid[]) AND during && tstzrange($2, $3, '[)')`, ids, w.start, w.end).
		Query(func(rows pgx.Rows) error {
			var node string
			var h Held
			_, err := pgx.ForEachRow(rows, []any{&node, &h.Resource, &h.Span.Lo, &h.Span.Hi, &h.Spot, &h.Reservation, &h.From, &h.To}, func() error {
				snaps[index[node]].Held = append(snaps[index[node]].Held, h)
				return nil
			})
			return err
		})
	return snaps
}
