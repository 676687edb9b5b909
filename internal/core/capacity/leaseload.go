package capacity

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// The reads of the pool-lease placer. A load reads, in one statement (so one snapshot), for every
// node asked for: its rollup row (schedulable, gpu_model, and changed: which transaction wrote it
// last), its GPUs and its whole-GPU bookings that have not ended; with the snapshot's xmin (every
// transaction it could not see has an id at least that) and which of our own pending
// transactions it saw committed. A delta reads the rollup rows written at or after a previous
// xmin. Times travel as microseconds since the epoch.

const loadSQL = `
WITH s AS (
  SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin, compute.compute_now() AS now,
    coalesce((SELECT array_agg(x) FROM unnest(@mine::text[]) x WHERE pg_visible_in_snapshot(x::xid8, pg_current_snapshot())), '{}') AS visible,
    coalesce((SELECT array_agg(x) FROM unnest(@mine::text[]) x WHERE pg_xact_status(x::xid8) = 'aborted'), '{}') AS aborted
)
SELECT s.xmin, s.now, s.visible, s.aborted, n.id, n.name, n.schedulable, n.gpu_model, n.changed,
  d.idx, d.uuid, d.model, d.domain, d.mode, d.shares, d.ok,
  b.lo, b.hi, b.spot, b.res, b.from_us, b.to_us
FROM s
LEFT JOIN LATERAL (
  SELECT nc.node_id AS uid, nc.node_id::text AS id, nn.name, nc.schedulable, nc.gpu_model, nc.changed::text AS changed
  FROM compute.node_capacity nc JOIN compute.nodes nn ON nn.id = nc.node_id
  WHERE nc.pool_id = @pool %s
) n ON true
LEFT JOIN LATERAL (
  SELECT array_agg(dv.index ORDER BY dv.index) AS idx, array_agg(dv.uuid ORDER BY dv.index) AS uuid,
    array_agg(dv.model ORDER BY dv.index) AS model, array_agg(dv.nvlink_domain ORDER BY dv.index) AS domain,
    array_agg(dv.mode ORDER BY dv.index) AS mode, array_agg(dv.shares ORDER BY dv.index) AS shares,
    array_agg(dv.health <> 'unhealthy' ORDER BY dv.index) AS ok
  FROM compute.devices dv WHERE dv.node_id = n.uid
) d ON true
LEFT JOIN LATERAL (
  SELECT array_agg(lower(bk.atoms)) AS lo, array_agg(upper(bk.atoms)) AS hi, array_agg(bk.spot) AS spot,
    array_agg(bk.reservation_id::text) AS res,
    array_agg((extract(epoch FROM lower(bk.during)) * 1000000)::bigint) AS from_us,
    array_agg(coalesce((extract(epoch FROM upper(bk.during)) * 1000000)::bigint, -1)) AS to_us
  FROM compute.bookings bk
  WHERE bk.node_id = n.uid AND bk.resource = 'gpu' AND bk.during && tstzrange(s.now, NULL)
) b ON true`

var (
	loadPoolSQL  = fmt.Sprintf(loadSQL, "")
	loadNodesSQL = fmt.Sprintf(loadSQL, "AND nc.node_id = ANY(@nodes::uuid[])")
)

// queueLoad queues in b the load of pool's nodes (nil: all of them), into out. mine are our
// transactions whose outcome is not known.
func queueLoad(b *pgx.Batch, pool string, nodes []string, mine []uint64, out *loaded) {
	sql, args := loadPoolSQL, pgx.NamedArgs{"pool": pool, "mine": xidTexts(mine)}
	if nodes != nil {
		sql, args["nodes"] = loadNodesSQL, nodes
	}
	b.Queue(sql, args).Query(func(rows pgx.Rows) error {
		var (
			xmin                  string
			visible, aborted      []string
			id, name, model, chg  *string
			sched                 *bool
			idx, shares, lo, hi   []int32
			uuid, models, domains []string
			modes, res            []string
			ok, spot              []bool
			from, to              []int64
		)
		first := true
		_, err := pgx.ForEachRow(rows, []any{&xmin, &out.now, &visible, &aborted, &id, &name, &sched, &model, &chg,
			&idx, &uuid, &models, &domains, &modes, &shares, &ok, &lo, &hi, &spot, &res, &from, &to}, func() error {
			if first {
				first = false
				x, err := parseXid(xmin)
				if err != nil {
					return err
				}
				out.xmin, out.visible, out.aborted = x, map[uint64]bool{}, map[uint64]bool{}
				for _, v := range visible {
					x, err := parseXid(v)
					if err != nil {
						return err
					}
					out.visible[x] = true
				}
				for _, v := range aborted {
					x, err := parseXid(v)
					if err != nil {
						return err
					}
					out.aborted[x] = true
				}
			}
			if id == nil {
				return nil // no node: the snapshot's row alone
			}
			c, err := parseXid(*chg)
			if err != nil {
				return err
			}
			n := loadedNode{id: *id, name: *name, model: *model, schedulable: *sched, changed: c}
			for i := range idx {
				n.gpus = append(n.gpus, GPUState{Index: int(idx[i]), UUID: uuid[i], Model: models[i], Domain: domains[i],
					Mode: modes[i], Shares: int(shares[i]), Healthy: ok[i]})
			}
			for i := range lo {
				h := Held{Resource: "gpu", Span: Span{int(lo[i]), int(hi[i])}, Spot: spot[i], Reservation: res[i],
					From: time.UnixMicro(from[i]).UTC()}
				if to[i] >= 0 {
					t := time.UnixMicro(to[i]).UTC()
					h.To = &t
				}
				n.held = append(n.held, h)
			}
			out.nodes = append(out.nodes, n)
			idx, uuid, models, domains, modes, shares, ok, lo, hi, spot, res, from, to = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
			return nil
		})
		return err
	})
}

// delta is what a delta read found.
type delta struct {
	xmin    uint64   // the oldest transaction running when it read
	xid     uint64   // the reading transaction's id (assigned by the read), when asked for
	nodes   []string // rollup rows written at or after the previous xmin
	changed []uint64 // by which transaction each was written
}

const deltaSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, %s,
  coalesce(array_agg(node_id::text), '{}'), coalesce(array_agg(changed::text), '{}')
FROM compute.node_capacity WHERE pool_id = $1 AND changed >= $2::text::xid8`

var (
	deltaOnlySQL = fmt.Sprintf(deltaSQL, "''")
	deltaXidSQL  = fmt.Sprintf(deltaSQL, "pg_current_xact_id()::text")
)

// queueDelta queues in b the read of pool's rollup rows written by transactions at or after
// since, into out; withXid also assigns the transaction its id and reads it.
func queueDelta(b *pgx.Batch, pool string, since uint64, withXid bool, out *delta) {
	sql := deltaOnlySQL
	if withXid {
		sql = deltaXidSQL
	}
	b.Queue(sql, pool, strconv.FormatUint(since, 10)).QueryRow(func(row pgx.Row) error {
		var xmin, xid string
		var changed []string
		if err := row.Scan(&xmin, &xid, &out.nodes, &changed); err != nil {
			return err
		}
		var err error
		if out.xmin, err = parseXid(xmin); err != nil {
			return err
		}
		if withXid {
			if out.xid, err = parseXid(xid); err != nil {
				return err
			}
		}
		out.changed = make([]uint64, len(changed))
		for i, c := range changed {
			if out.changed[i], err = parseXid(c); err != nil {
				return err
			}
		}
		return nil
	})
}

// xactStatus reads whether each of xids committed ("committed", "aborted", "in progress"; ""
// when the database no longer knows).
func xactStatus(b *pgx.Batch, xids []uint64, out map[uint64]string) {
	b.Queue(`SELECT x, coalesce(pg_xact_status(x::xid8), '') FROM unnest($1::text[]) x`, xidTexts(xids)).Query(func(rows pgx.Rows) error {
		var x, status string
		_, err := pgx.ForEachRow(rows, []any{&x, &status}, func() error {
			v, err := parseXid(x)
			out[v] = status
			return err
		})
		return err
	})
}

func parseXid(s string) (uint64, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("capacity: a transaction id %q: %w", s, err)
	}
	return v, nil
}

func xidTexts(xids []uint64) []string {
	out := make([]string, len(xids))
	for i, x := range xids {
		out[i] = strconv.FormatUint(x, 10)
	}
	return out
}

// leaseStale is the SQLSTATE of leaseLockSQL's refusal: the holder's memory of the nodes
// in the error's detail is stale.
const leaseStale = "BCL01"

// staleWrite reports whether err is a lease holder's write refused because its memory was stale:
// by leaseLockSQL, or by the exclusion constraint (a booking it had not heard of).
func staleWrite(err error) bool {
	c := postgres.ErrorCode(err)
	return c == leaseStale || c == postgres.ExclusionViolation
}
