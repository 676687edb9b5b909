package capacity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/postgres"
)

// releaseQuota gives a reservation's claims back to the quotas of its tenant in its pool. (Adding
// is the placement's, in its final write: quotaRows.queue checks the limits there.)
func releaseQuota(ctx context.Context, tx pgx.Tx, tenant, pool string, cl claims) error {
	b := &pgx.Batch{}
	queueQuotaRelease(b, tenant, pool, cl)
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, b).Close()
}

// quotaItem is one resource a reservation claims, as quotas count it.
type quotaItem struct {
	resource, model string
	n               int
}

// quotaItems lists what cl claims, in a fixed order.
func quotaItems(cl claims) []quotaItem {
	var items []quotaItem
	for _, m := range slices.Sorted(maps.Keys(cl.GPUs)) {
		items = append(items, quotaItem{api.QuotaGPUs, m, cl.GPUs[m]})
	}
	if cl.MemoryGiB > 0 {
		items = append(items, quotaItem{api.QuotaMemoryGiB, "", cl.MemoryGiB})
	}
	if cl.VCPUs > 0 {
		items = append(items, quotaItem{api.QuotaVCPUs, "", cl.VCPUs})
	}
	return items
}

// queueQuotaRelease gives cl back to the quotas of tenant in pool, in b: the rows are locked in
// one order first, as lockQuotaSets does.
func queueQuotaRelease(b *pgx.Batch, tenant, pool string, cl claims) {
	items := quotaItems(cl)
	if len(items) == 0 {
		return
	}
	b.Queue(lockQuotaSetsSQL, []string{tenant}, []string{pool})
	for _, it := range items {
		b.Queue(`UPDATE compute.quotas SET used = greatest(used - $5, 0), updated_at = compute.compute_now()
			WHERE tenant_id = $1 AND pool_id = $2 AND resource = $3 AND (model = '' OR model = $4)`, tenant, pool, it.resource, it.model, it.n)
	}
}

// quotaRows are a tenant's quotas in a pool, as the booking transaction read them.
type quotaRows []api.Quota

const quotaRowsSQL = `SELECT tenant_id, pool_id::text, resource, model, "limit", used FROM compute.quotas
	WHERE tenant_id = $1 AND pool_id = $2 ORDER BY resource, model`

// readQuotas reads a tenant's quotas in a pool without locking them: enough to refuse a request
// that is over quota before looking for room. The check that counts is made by the write's
// increments, under the rows' locks (quotaRows.queue).
func readQuotas(ctx context.Context, q postgres.Querier, tenant, pool string) (quotaRows, error) {
	rows, err := q.Query(ctx, quotaRowsSQL, tenant, pool)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[api.Quota])
}

// queueQuotas queues in b the read of readQuotas, into out.
func queueQuotas(b *pgx.Batch, tenant, pool string, out *quotaRows) {
	b.Queue(quotaRowsSQL, tenant, pool).Query(func(rows pgx.Rows) error {
		var err error
		*out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[api.Quota])
		return err
	})
}

// quotaKey names the quotas of one tenant in one pool.
type quotaKey struct{ tenant, pool string }

// lockQuotaSets locks every quota row of keys, in one statement and one order. Quotas are the
// last rows a capacity transaction locks (see docs/capacity.md, "Lock order"), so a transaction
// that holds them waits for nothing else.
func lockQuotaSets(ctx context.Context, tx pgx.Tx, keys ...quotaKey) error {
	if len(keys) == 0 {
		return nil
	}
	tenants, pools := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		tenants[i], pools[i] = k.tenant, k.pool
	}
	_, err := tx.Exec(ctx, lockQuotaSetsSQL, tenants, pools)
	return err
}

const lockQuotaSetsSQL = `SELECT 1 FROM compute.quotas q, unnest($1::text[], $2::uuid[]) AS k(t, p)
	WHERE q.tenant_id = k.t AND q.pool_id = k.p ORDER BY q.tenant_id, q.pool_id, q.resource, q.model FOR UPDATE OF q`

// amount is how much of quota q's resource cl claims.
func amount(q api.Quota, cl claims) int {
	switch q.Resource {
	case api.QuotaGPUs:
		n := 0
		for m, c := range cl.GPUs {
			if q.Model == "" || q.Model == m {
				n += c
			}
		}
		return n
	case api.QuotaVCPUs:
		return cl.VCPUs
	default:
		return cl.MemoryGiB
	}
}

// check refuses claims that would take any quota over its limit.
func (qs quotaRows) check(tenant string, cl claims) error {
	for _, q := range qs {
		n := amount(q, cl)
		if n == 0 || q.Used+n <= q.Limit {
			continue
		}
		what := q.Resource
		if q.Resource == api.QuotaGPUs {
			what = "GPUs"
			if q.Model != "" {
				what = q.Model + " GPUs"
			}
		}
		return &api.Error{Code: api.CodeQuotaExceeded,
			Message: fmt.Sprintf("quota exceeded: tenant %s may hold %d %s in this pool; it holds %d and asks for %d more", tenant, q.Limit, what, q.Used, n),
			Details: map[string]any{"reason": "quota", "resource": q.Resource, "model": q.Model, "limit": q.Limit, "used": q.Used, "requested": n}}
	}
	return nil
}

// requested is what a request will claim, as far as it is known before placement: the GPUs'
// model only when the request names one.
func requested(in api.CreateReservation) claims {
	m := in.MemberCount()
	cl := claims{VCPUs: in.VCPUs * m, MemoryGiB: in.MemoryGiB * m}
	if in.GPUs > 0 {
		cl.GPUs = map[string]int{in.Model: in.GPUs * m}
	}
	return cl
}

// add counts claims in the rows read, for the next check in the same transaction.
func (qs quotaRows) add(cl claims) {
	for i := range qs {
		qs[i].Used += amount(qs[i], cl)
	}
}

// queue adds the claims to the quotas read, in b. Each UPDATE locks its row and checks the limit
// again against what is counted now, so a quota read without a lock still holds: over it, the
// batch fails with quota_exceeded and the transaction is rolled back.
func (qs quotaRows) queue(b *pgx.Batch, tenant, pool string, cl claims) {
	for _, q := range qs {
		n := amount(q, cl)
		if n == 0 {
			continue
		}
		b.Queue(`UPDATE compute.quotas SET used = used + $5, updated_at = compute.compute_now()
			WHERE tenant_id = $1 AND pool_id = $2 AND resource = $3 AND model = $4 RETURNING "limit", used`, tenant, pool, q.Resource, q.Model, n).
			QueryRow(func(row pgx.Row) error {
				var limit, used int
				err := row.Scan(&limit, &used)
				if errors.Is(err, pgx.ErrNoRows) || (err == nil && used <= limit) {
					return nil // deleted meanwhile, or within its limit
				}
				if err != nil {
					return err
				}
				q.Limit, q.Used = limit, used-n
				return quotaRows{q}.check(tenant, cl)
			})
	}
}

// liveReservation is a pending or active reservation, locked.
type liveReservation struct {
	ID, TenantID, PoolID, State string
	Spot                        bool
	StartsAt                    time.Time
	EndsAt                      *time.Time
	EndReason                   *string
	Claims                      claims
	Now                         time.Time // compute_now(), read with it
}

func lockReservation(ctx context.Context, tx pgx.Tx, id, tenant string) (liveReservation, error) {
	var r liveReservation
	err := tx.QueryRow(ctx, `SELECT id::text, tenant_id, pool_id::text, state, spot, starts_at, ends_at, end_reason, claims, compute.compute_now()
		FROM compute.reservations WHERE id = $1 AND tenant_id = $2 FOR NO KEY UPDATE`, id, tenant).
		Scan(&r.ID, &r.TenantID, &r.PoolID, &r.State, &r.Spot, &r.StartsAt, &r.EndsAt, &r.EndReason, &r.Claims, &r.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, api.NotFound("reservation", id)
	}
	return r, err
}

// lockNodesOf takes the rollup locks of every node the reservations hold something on, in node
// order, before their reservation rows: nodes come before reservations in every path (see
// docs/capacity.md, "Lock order").
// It returns the nodes: the ones whose rollups a change to the reservations recounts (all of
// them, not only those whose bookings change now: a booking that ended before the worker saw it is
// still counted until then).
func lockNodesOf(ctx context.Context, q postgres.Querier, ids []string) ([]string, error) {
	return collectNodes(q.Query(ctx, lockNodesOfSQL, ids))
}

const lockNodesOfSQL = `SELECT node_id::text FROM compute.node_capacity WHERE node_id IN (
	SELECT node_id FROM compute.bookings WHERE reservation_id = ANY($1::uuid[])) ORDER BY node_id FOR UPDATE`

func collectNodes(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// truncateBookings ends the bookings of reservations at t: those that start at or after t are
// deleted, the others end at t. The caller holds the nodes' locks.
func truncateBookings(ctx context.Context, q postgres.Querier, ids []string, t time.Time) error {
	_, err := q.Exec(ctx, truncateSQL, ids, t)
	return err
}

const truncateSQL = `WITH d AS (
	  DELETE FROM compute.bookings WHERE reservation_id = ANY($1::uuid[]) AND lower(during) >= $2
	)
	UPDATE compute.bookings SET during = tstzrange(lower(during), $2, '[)')
	WHERE reservation_id = ANY($1::uuid[]) AND lower(during) < $2 AND (upper_inf(during) OR upper(during) > $2)`

// preemptSpot ends spot reservations at t, because normal booking by now needs their atoms from
// t on. One that has not started by t is preempted at once; one that has is preempted at t
// (now, or later by the worker, which finishes what is decided here). The caller holds the locks
// of the nodes it planned on. It returns the victims' nodes and the victims, whose quota the
// caller releases after locking quotas.
func preemptSpot(ctx context.Context, tx pgx.Tx, ids []string, t, now time.Time, by string) ([]string, []ended, error) {
	// The victims' nodes other than the caller's: a wait while holding nodes, as a placer's for
	// its next candidate (see docs/capacity.md, "Lock order").
	nodes, err := lockNodesOf(ctx, tx, ids)
	if err != nil {
		return nil, nil, err
	}
	if err := truncateBookings(ctx, tx, ids, t); err != nil {
		return nil, nil, fmt.Errorf("capacity: preempt: %w", err)
	}
	rows, err := tx.Query(ctx, `UPDATE compute.reservations SET
		  state = CASE WHEN starts_at >= $2 OR $2 <= $3 THEN 'preempted' ELSE state END,
		  ends_at = CASE WHEN starts_at >= $2 THEN ends_at ELSE $2 END,
		  end_reason = 'preempted', ended_by = $4,
		  ended_at = CASE WHEN starts_at >= $2 THEN $3 WHEN $2 <= $3 THEN $2 END,
		  updated_at = $3
		WHERE id = ANY($1::uuid[]) AND spot AND state IN ('pending', 'active')
		RETURNING id::text, tenant_id, pool_id::text, state, claims`, ids, t, now, by)
	if err != nil {
		return nil, nil, fmt.Errorf("capacity: preempt: %w", err)
	}
	var all []ended
	var e ended
	if _, err := pgx.ForEachRow(rows, []any{&e.id, &e.tenant, &e.pool, &e.state, &e.cl}, func() error {
		all = append(all, e)
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, e := range all {
		if err := events.Emit(ctx, tx, "reservation.preempted", e.tenant, e.id, map[string]any{"at": t, "by": by}); err != nil {
			return nil, nil, err
		}
	}
	return nodes, all, nil
}

// ended is a reservation a transaction moved to an end state (or decided to end later).
type ended struct {
	id, tenant, pool, state string
	cl                      claims
}

// quotaKeys lists the quota sets of own (may be zero) and of the reservations in es that ended now.
func quotaKeys(own quotaKey, es []ended) []quotaKey {
	var keys []quotaKey
	if own != (quotaKey{}) {
		keys = append(keys, own)
	}
	for _, e := range es {
		if isEnded(e.state) {
			keys = append(keys, quotaKey{e.tenant, e.pool})
		}
	}
	return keys
}

// releaseQuotas gives back the quota of the reservations in es that ended now. The caller has
// locked their quota sets with lockQuotaSets.
func releaseQuotas(ctx context.Context, tx pgx.Tx, es []ended) error {
	for _, e := range es {
		if isEnded(e.state) {
			if err := releaseQuota(ctx, tx, e.tenant, e.pool, e.cl); err != nil {
				return err
			}
		}
	}
	return nil
}

func isEnded(state string) bool {
	return state != api.ReservationPending && state != api.ReservationActive
}

// release ends an active reservation now. After its locks it is one round trip: a release
// holds its nodes, which placers wait for, for as short a time as it can.
func release(ctx context.Context, tx pgx.Tx, id, tenant string) error {
	nodes, err := lockNodesOf(ctx, tx, []string{id})
	if err != nil {
		return err
	}
	r, err := lockReservation(ctx, tx, id, tenant)
	if err != nil {
		return err
	}
	if r.State != api.ReservationActive {
		return notLive(r, "released", "only an active reservation is released; a pending one is cancelled")
	}
	b := &pgx.Batch{}
	b.Queue(truncateSQL, []string{r.ID}, r.Now)
	b.Queue(`UPDATE compute.reservations SET state = 'released', ended_at = $2, updated_at = $2 WHERE id = $1`, r.ID, r.Now)
	queueFinish(b, r, "reservation.released", nodes)
	return tx.SendBatch(ctx, b).Close()
}

// cancel ends a pending reservation before it starts.
func cancel(ctx context.Context, tx pgx.Tx, id, tenant string) error {
	nodes, err := lockNodesOf(ctx, tx, []string{id})
	if err != nil {
		return err
	}
	r, err := lockReservation(ctx, tx, id, tenant)
	if err != nil {
		return err
	}
	if r.State != api.ReservationPending {
		return notLive(r, "cancelled", "only a pending reservation is cancelled; an active one is released")
	}
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM compute.bookings WHERE reservation_id = $1`, r.ID)
	b.Queue(`UPDATE compute.reservations SET state = 'cancelled', ended_at = $2, updated_at = $2 WHERE id = $1`, r.ID, r.Now)
	// A pending reservation whose start the worker has not yet seen pass holds its nodes now:
	// their rollups are recounted like any other change's. They are marked changed either way.
	queueFinish(b, r, "reservation.cancelled", nodes)
	if len(nodes) > 0 {
		b.Queue(stampSQL, nodes)
	}
	return tx.SendBatch(ctx, b).Close()
}

// queueFinish gives back an ended reservation's quota, recounts its nodes and writes its event, in b.
func queueFinish(b *pgx.Batch, r liveReservation, event string, nodes []string) {
	queueQuotaRelease(b, r.TenantID, r.PoolID, r.Claims)
	if len(nodes) > 0 {
		b.Queue(lockSQL, nodes)
		b.Queue(refreshSQL, nodes)
	}
	events.QueueEmit(b, event, r.TenantID, r.ID, nil)
}

func notLive(r liveReservation, verb, hint string) error {
	return &api.Error{Code: api.CodeFailedPrecondition,
		Message: fmt.Sprintf("reservation %s is %s and cannot be %s: %s", r.ID, r.State, verb, hint),
		Details: map[string]any{"reason": "state", "state": r.State}}
}

// extend moves a reservation's end later. The spot bookings in the way are preempted; a normal
// booking in the way makes the database refuse it.
func extend(ctx context.Context, tx pgx.Tx, in api.ExtendReservation, tenant string) error {
	nodes, err := lockNodesOf(ctx, tx, []string{in.Reservation})
	if err != nil {
		return err
	}
	r, err := lockReservation(ctx, tx, in.Reservation, tenant)
	if err != nil {
		return err
	}
	switch {
	case r.State != api.ReservationPending && r.State != api.ReservationActive:
		return notLive(r, "extended", "it has ended")
	case r.EndsAt == nil:
		return &api.Error{Code: api.CodeFailedPrecondition, Message: fmt.Sprintf("reservation %s holds until released; there is no end to move", r.ID),
			Details: map[string]any{"reason": "unbounded"}}
	case r.EndReason != nil:
		return &api.Error{Code: api.CodeFailedPrecondition, Message: fmt.Sprintf("reservation %s is being preempted at %s", r.ID, r.EndsAt.Format(time.RFC3339)),
			Details: map[string]any{"reason": "preempted"}}
	}
	oldEnd := *r.EndsAt
	var newEnd time.Time
	if in.End != nil {
		newEnd = *in.End
	} else {
		d, _ := api.ParseDuration("by", in.By)
		newEnd = oldEnd.Add(d)
		if err := api.CheckTime("by", newEnd); err != nil { // repeated extensions must stay representable
			return err
		}
	}
	if !newEnd.After(oldEnd) {
		return api.InvalidField("end", "%s is not after the current end %s", newEnd.Format(time.RFC3339), oldEnd.Format(time.RFC3339))
	}
	now, err := dbNow(ctx, tx)
	if err != nil {
		return err
	}
	if !oldEnd.After(now) {
		// Ended, though the worker has not yet marked it so.
		return &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("reservation %s ended at %s and cannot be extended", r.ID, oldEnd.Format(time.RFC3339)),
			Details: map[string]any{"reason": "state", "state": api.ReservationExpired}}
	}
	if !r.Spot {
		rows, err := tx.Query(ctx, `SELECT DISTINCT s.reservation_id::text FROM compute.bookings b
			JOIN compute.bookings s ON s.node_id = b.node_id AND s.resource = b.resource AND s.atoms && b.atoms AND s.spot
			  AND s.during && tstzrange($2, $3, '[)')
			WHERE b.reservation_id = $1`, r.ID, oldEnd, newEnd)
		if err != nil {
			return err
		}
		spot, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(spot) > 0 {
			nodes, victims, err := preemptSpot(ctx, tx, spot, oldEnd, now, r.ID)
			if err != nil {
				return err
			}
			if err := lockQuotaSets(ctx, tx, quotaKeys(quotaKey{}, victims)...); err != nil {
				return err
			}
			if err := releaseQuotas(ctx, tx, victims); err != nil {
				return err
			}
			if err := RefreshNodes(ctx, tx, nodes...); err != nil {
				return err
			}
		}
	}
	_, err = tx.Exec(ctx, `UPDATE compute.bookings SET during = tstzrange(lower(during), $2, '[)') WHERE reservation_id = $1`, r.ID, newEnd)
	if postgres.ErrorCode(err) == postgres.ExclusionViolation {
		return &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("reservation %s cannot be extended to %s: what it holds is booked by another reservation before then", r.ID, newEnd.Format(time.RFC3339)),
			Details: map[string]any{"reason": "booked", "end": newEnd}}
	}
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.reservations SET ends_at = $2, updated_at = $3 WHERE id = $1`, r.ID, newEnd, now); err != nil {
		return err
	}
	if len(nodes) > 0 {
		if _, err := tx.Exec(ctx, stampSQL, nodes); err != nil { // the end moved: a pool lease holder reads the nodes again
			return err
		}
	}
	return events.Emit(ctx, tx, "reservation.extended", r.TenantID, r.ID, map[string]any{"from": oldEnd, "to": newEnd})
}

// EndOnNode ends every live reservation that holds something on a node (a drain that does not
// wait): active ones are released, pending ones cancelled, whole, even when they span other nodes.
func EndOnNode(ctx context.Context, tx pgx.Tx, nodeID string) (int, error) {
	rows, err := tx.Query(ctx, `SELECT DISTINCT r.id::text, r.tenant_id, r.state FROM compute.reservations r
		JOIN compute.bookings b ON b.reservation_id = r.id
		WHERE b.node_id = $1 AND r.state IN ('pending', 'active') ORDER BY 1`, nodeID)
	if err != nil {
		return 0, err
	}
	type live struct{ id, tenant, state string }
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (live, error) {
		var l live
		return l, r.Scan(&l.id, &l.tenant, &l.state)
	})
	if err != nil {
		return 0, err
	}
	// Every lock the loop needs, in the lock order, before it ends the first: nodes, reservations,
	// quotas.
	ids := make([]string, len(all))
	for i, l := range all {
		ids[i] = l.id
	}
	if _, err := lockNodesOf(ctx, tx, ids); err != nil {
		return 0, err
	}
	krows, err := tx.Query(ctx, `SELECT tenant_id, pool_id::text FROM compute.reservations WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE`, ids)
	if err != nil {
		return 0, err
	}
	keys, err := pgx.CollectRows(krows, func(r pgx.CollectableRow) (quotaKey, error) {
		var k quotaKey
		return k, r.Scan(&k.tenant, &k.pool)
	})
	if err != nil {
		return 0, err
	}
	if err := lockQuotaSets(ctx, tx, keys...); err != nil {
		return 0, err
	}
	for _, l := range all {
		if l.state == api.ReservationActive {
			err = release(ctx, tx, l.id, l.tenant)
		} else {
			err = cancel(ctx, tx, l.id, l.tenant)
		}
		if err != nil {
			return 0, fmt.Errorf("capacity: end reservation %s on node %s: %w", l.id, nodeID, err)
		}
	}
	return len(all), markDrained(ctx, tx, ids, nodeID)
}

// HoldsOnNode reports whether anything is booked on a node now or later.
func HoldsOnNode(ctx context.Context, q postgres.Querier, nodeID string) (bool, error) {
	var held bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.bookings WHERE node_id = $1
		AND (upper_inf(during) OR upper(during) > compute.compute_now()))`, nodeID).Scan(&held)
	return held, err
}
