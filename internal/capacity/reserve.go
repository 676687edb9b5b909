package capacity

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/events"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// maxCandidates bounds how many nodes one member tries before the request is refused.
const maxCandidates = 64

// window is a request's time range; a nil end is "until released".
type window struct {
	start time.Time
	end   *time.Time
}

// dbNow reads compute_now(): every decision about time is the database's.
func dbNow(ctx context.Context, q postgres.Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&t)
	return t, err
}

// requestWindow turns a request's start, duration and end into a window, against now.
func requestWindow(now time.Time, start *time.Time, duration string, end *time.Time) (window, error) {
	w := window{start: now}
	if start != nil {
		if start.Before(now.Add(-time.Minute)) {
			return w, api.InvalidField("start", "%s is in the past (now is %s)", start.Format(time.RFC3339), now.Format(time.RFC3339))
		}
		if start.After(now) {
			w.start = *start
		}
	}
	if duration != "" {
		d, err := api.ParseDuration("duration", duration)
		if err != nil {
			return w, err
		}
		e := w.start.Add(d)
		w.end = &e
	}
	if end != nil {
		if !end.After(w.start) {
			return w, api.InvalidField("end", "%s is not after the start %s", end.Format(time.RFC3339), w.start.Format(time.RFC3339))
		}
		e := *end
		w.end = &e
	}
	return w, nil
}

// claims is what a reservation counts against quotas.
type claims struct {
	GPUs      map[string]int `json:"gpus,omitempty"` // by model
	VCPUs     int            `json:"vcpus,omitempty"`
	MemoryGiB int            `json:"memoryGiB,omitempty"`
}

// request is a reservation being placed.
type request struct {
	tenant, pool, principal string
	in                      api.CreateReservation
	w                       window
	now                     time.Time
	id                      string
}

// reserve places and books a reservation inside the call's transaction.
func reserve(ctx context.Context, c *modules.Call, in api.CreateReservation) (api.Reservation, error) {
	tx := c.Tx
	pool, err := resolvePool(ctx, tx, c.Target.TenantPath, in.Pool)
	if err != nil {
		return api.Reservation{}, err
	}
	if in.MIGProfile != "" {
		if _, ok := MIGProfile(in.Model, in.MIGProfile); !ok {
			return api.Reservation{}, migProfileError(in.Model, in.MIGProfile)
		}
	}
	now := pool.Now
	w, err := requestWindow(now, in.Start, in.Duration, in.End)
	if err != nil {
		return api.Reservation{}, err
	}
	r := request{tenant: c.Target.TenantID, pool: pool.ID, principal: c.Principal.ID, in: in, w: w, now: now, id: fleet.NewID()}

	// Over quota is known before placing: say so rather than look for room. The rows are read,
	// not locked: quotas are locked last, after the nodes (see docs/capacity.md, "Lock order").
	quotas, err := readQuotas(ctx, tx, r.tenant, r.pool)
	if err != nil {
		return api.Reservation{}, err
	}
	if err := quotas.check(r.tenant, requested(in)); err != nil {
		return api.Reservation{}, err
	}

	// Place every member first: a gang is booked whole or not at all.
	var plans []memberPlan
	used := []string{}
	for m := range in.MemberCount() {
		p, err := r.placeMember(ctx, tx, used)
		if err != nil {
			return api.Reservation{}, err
		}
		if p == nil {
			return api.Reservation{}, r.noCapacity(ctx, tx, m)
		}
		plans = append(plans, *p)
		used = append(used, p.node.NodeID)
	}

	cl := claims{VCPUs: in.VCPUs * len(plans), MemoryGiB: in.MemoryGiB * len(plans)}
	for _, p := range plans {
		for _, pk := range p.plan.Picks {
			if pk.Kind == "gpu" {
				if cl.GPUs == nil {
					cl.GPUs = map[string]int{}
				}
				cl.GPUs[pk.Model] += int(pk.Units)
			}
		}
	}
	active := !w.start.After(now)
	state := api.ReservationPending
	if active {
		state = api.ReservationActive
	}
	labels := in.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	if err := quotas.check(r.tenant, cl); err != nil {
		return api.Reservation{}, err
	}

	// Normal bookings end the spot bookings they overlap, in this transaction, before they are
	// written: the constraint would refuse them otherwise.
	var preempt []string
	for _, p := range plans {
		preempt = append(preempt, p.plan.Preempts...)
	}
	touched := map[string]bool{}
	var victims []ended
	if len(preempt) > 0 {
		nodes, es, err := preemptSpot(ctx, tx, uniq(preempt), w.start, now, r.id)
		if err != nil {
			return api.Reservation{}, err
		}
		for _, n := range nodes {
			touched[n] = true
		}
		victims = es
	}

	// Quotas last: the victims' and this tenant's, all at once, when spot was preempted. This
	// tenant's increments in the write below check the limits again under their row locks.
	if len(victims) > 0 {
		if err := lockQuotaSets(ctx, tx, quotaKeys(quotaKey{r.tenant, r.pool}, victims)...); err != nil {
			return api.Reservation{}, err
		}
		if err := releaseQuotas(ctx, tx, victims); err != nil {
			return api.Reservation{}, err
		}
	}

	b := &pgx.Batch{}
	b.Queue(`INSERT INTO compute.reservations (id, tenant_id, pool_id, state, spot, shape, members, claims, starts_at, ends_at, labels, created_by, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13)`,
		r.id, r.tenant, r.pool, state, in.Spot, in.Shape, len(plans), cl, w.start, w.end, labels, r.principal, now)
	for m, p := range plans {
		queueBookings(b, r.id, m, p.node.NodeID, p.plan.Picks, w, in.Spot)
		if active {
			touched[p.node.NodeID] = true
		}
	}
	if nodes := sortedKeys(touched); len(nodes) > 0 {
		// Recounted, not decremented: see refreshSQL. The nodes are locked already.
		b.Queue(refreshSQL, nodes)
	}
	quotas.queue(b, r.tenant, r.pool, cl) // quotas last
	events.QueueEmit(b, "reservation.created", r.tenant, r.id, map[string]any{"pool": r.pool, "state": state, "spot": in.Spot})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		if isAPIError(err) {
			return api.Reservation{}, err // over quota, counted under the rows' locks
		}
		if postgres.ErrorCode(err) == postgres.ExclusionViolation {
			// Someone booked these atoms without the node lock (another path): try again afresh.
			return api.Reservation{}, modules.Retry(&api.Error{Code: api.CodeConflict, Message: "the capacity chosen was booked concurrently; try again"})
		}
		return api.Reservation{}, err
	}

	res := api.Reservation{
		ID: r.id, TenantID: r.tenant, PoolID: r.pool, State: state, Spot: in.Spot, Shape: in.Shape, Members: len(plans),
		StartsAt: w.start, EndsAt: w.end, Labels: labels, CreatedBy: r.principal, CreatedAt: now, UpdatedAt: now,
	}
	for _, p := range plans {
		res.Allocations = append(res.Allocations, allocation(p.node.NodeID, p.node.Name, in.Shape, p.plan.Picks, p.node.GPUs))
	}
	return res, nil
}

type memberPlan struct {
	node NodeSnapshot
	plan MemberPlan
}

// placeMember finds a node for one member: it locks candidates one at a time (SKIP LOCKED, so
// concurrent placers take different nodes instead of queueing), reads the locked node's exact
// state over the window and plans on it. A candidate that does not fit is passed over, keeping its
// lock until the transaction ends. When every candidate is locked by another placer, it waits for
// the best one rather than answer that there is no room. nil means no candidate fits.
func (r request) placeMember(ctx context.Context, tx pgx.Tx, used []string) (*memberPlan, error) {
	tried := append([]string{}, used...)
	nowPath := !r.w.start.After(r.now)
	// The index walk serves whole GPUs now, without labels or vCPUs: first without touching spot
	// holders, then (for a normal request) counting them.
	simple := nowPath && r.in.GPUs > 0 && r.in.VCPUs == 0 && r.in.MemoryGiB == 0 && len(r.in.RequireLabels) == 0 && len(r.in.AvoidLabels) == 0
	passes := []bool{false}
	if simple && !r.in.Spot {
		passes = append(passes, true)
	}
	pass := 0
	for range maxCandidates {
		var nodeID, name string
		var q string
		var args []any
		if simple {
			q = fitAnySQL
			if r.in.Model != "" {
				q = fitModelSQL
			}
			args = []any{r.pool, r.in.Model, r.in.GPUs, passes[pass], tried}
		} else {
			q, args = candidateSQL, []any{r.pool, r.in.Model, r.in.GPUs, r.in.Spot, r.in.VCPUs, r.in.MemoryGiB,
				labelsOrEmpty(r.in.RequireLabels), labelsOrEmpty(r.in.AvoidLabels), tried, nowPath, shapeKind(r.in.Shape)}
		}
		err := tx.QueryRow(ctx, q+" SKIP LOCKED", args...).Scan(&nodeID, &name)
		if err == pgx.ErrNoRows {
			// Every candidate left is locked by another placer: wait for the best, for at most
			// placementWait. A placer that holds candidates already may so close a cycle with
			// another; PostgreSQL breaks it (40P01) and the envelope runs the call again (see
			// docs/capacity.md, "Lock order").
			err = r.waitForCandidate(ctx, tx, q, args, &nodeID, &name)
		}
		if err == pgx.ErrNoRows && simple && pass+1 < len(passes) {
			pass++
			continue
		}
		if err == pgx.ErrNoRows {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("capacity: candidate: %w", err)
		}
		tried = append(tried, nodeID)
		snap, err := loadSnapshot(ctx, tx, nodeID, name, r.w)
		if err != nil {
			return nil, err
		}
		if plan, ok := Plan(snap, r.in.Shape, r.in.Spot); ok {
			return &memberPlan{snap, plan}, nil
		}
	}
	return nil, nil
}

// placementWait bounds how long a placer waits for a node another placer holds. Past it the
// answer is no room, contended: under a storm of requests for the last free GPUs, a caller
// hears within seconds that it should try again, rather than queue behind every other.
const placementWait = "1s"

// waitForCandidate runs the candidate query q without SKIP LOCKED, under placementWait.
func (r request) waitForCandidate(ctx context.Context, tx pgx.Tx, q string, args []any, nodeID, name *string) error {
	var was string
	if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`, placementWait).Scan(&was, nil); err != nil {
		return err
	}
	err := tx.QueryRow(ctx, q, args...).Scan(nodeID, name)
	if postgres.ErrorCode(err) == postgres.LockNotAvailable {
		return &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("pool %s has no room for %s now: the nodes that may fit stayed busy with concurrent requests for %s; try again", r.in.Pool, describeShape(r.in.Shape), placementWait),
			Details: map[string]any{"reason": NoRoomContended}}
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err // the transaction is aborted
	}
	if _, rerr := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, was); rerr != nil {
		return rerr
	}
	return err
}

// fitSQL is the common case, N whole GPUs now with no label filter: an index walk over the pool's
// schedulable nodes in best-fit order (fewest free GPUs first, so large free blocks stay whole),
// stopping at the first unlocked node that fits. $4 true lets GPUs held by spot bookings count,
// for the second pass of a normal request. %s is the model condition: two statements, not one
// with an OR, so that a prepared statement's generic plan still walks the index in order.
const fitSQL = `
SELECT nc.node_id::text, n.name
FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id
WHERE nc.pool_id = $1 AND nc.schedulable AND %s
  AND nc.gpus_free + CASE WHEN $4 THEN nc.gpus_spot ELSE 0 END >= $3
  AND NOT nc.node_id = ANY(coalesce($5::uuid[], '{}'))
ORDER BY %s nc.gpus_free, nc.node_id
LIMIT 1
FOR UPDATE OF nc`

var (
	fitModelSQL = fmt.Sprintf(fitSQL, "nc.gpu_model = $2", "nc.gpu_model,")
	fitAnySQL   = fmt.Sprintf(fitSQL, "$2 = ''", "")
)

// candidateSQL picks and locks one node that may fit a member, for every other case. On the
// "now" path it reads the rollups: nodes whose free GPUs suffice without preempting come first,
// then the tightest fit. A future window only has static filters; the exact check is the
// snapshot's.
const candidateSQL = `
SELECT nc.node_id::text, n.name
FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id
WHERE nc.pool_id = $1 AND nc.schedulable
  AND n.labels @> $7
  AND NOT EXISTS (SELECT 1 FROM jsonb_each_text($8) a WHERE n.labels ->> a.key = a.value)
  AND NOT nc.node_id = ANY(coalesce($9::uuid[], '{}'))
  AND CASE $11::text
      WHEN 'gpu' THEN ($2 = '' OR nc.gpu_model = $2 OR nc.gpu_model = 'mixed') AND nc.gpus_total >= $3
        AND (NOT $10 OR nc.gpus_free + CASE WHEN $4 THEN 0 ELSE nc.gpus_spot END >= $3)
      WHEN 'mig' THEN nc.mig_gpus > 0
      WHEN 'share' THEN nc.ts_gpus > 0
      ELSE true END
  AND nc.vcpus_total >= $5 AND nc.memory_total >= $6
  AND (NOT $10 OR (nc.vcpus_total - nc.vcpus_used - CASE WHEN $4 THEN nc.vcpus_spot ELSE 0 END >= $5
                   AND nc.memory_total - nc.memory_used - CASE WHEN $4 THEN nc.memory_spot ELSE 0 END >= $6))
ORDER BY
  CASE WHEN $10 AND $11 = 'gpu' AND nc.gpus_free >= $3 THEN 0 ELSE 1 END,
  CASE WHEN $10 AND $11 = 'gpu' THEN nc.gpus_free ELSE 0 END,
  CASE WHEN $10 THEN nc.vcpus_total - nc.vcpus_used ELSE 0 END,
  nc.node_id
LIMIT 1
FOR UPDATE OF nc`

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

// loadSnapshot reads one node's devices, resources and the bookings overlapping w, in one round trip.
func loadSnapshot(ctx context.Context, q pgx.Tx, nodeID, name string, w window) (NodeSnapshot, error) {
	snap := NodeSnapshot{NodeID: nodeID, Name: name}
	b := &pgx.Batch{}
	b.Queue(`SELECT index, uuid, model, nvlink_domain, mode, shares, health <> 'unhealthy' FROM compute.devices WHERE node_id = $1 ORDER BY index`, nodeID).
		Query(func(rows pgx.Rows) error {
			var g GPUState
			_, err := pgx.ForEachRow(rows, []any{&g.Index, &g.UUID, &g.Model, &g.Domain, &g.Mode, &g.Shares, &g.Healthy}, func() error {
				snap.GPUs = append(snap.GPUs, g)
				return nil
			})
			return err
		})
	b.Queue(`SELECT coalesce((SELECT vcpus FROM compute.node_resources WHERE node_id = $1), 0),
		coalesce((SELECT memory_gib FROM compute.node_resources WHERE node_id = $1), 0)`, nodeID).
		QueryRow(func(row pgx.Row) error { return row.Scan(&snap.VCPUs, &snap.MemoryGiB) })
	b.Queue(`SELECT resource, lower(atoms), upper(atoms), spot, reservation_id::text FROM compute.bookings
		WHERE node_id = $1 AND during && tstzrange($2, $3, '[)')`, nodeID, w.start, w.end).
		Query(func(rows pgx.Rows) error {
			var h Held
			_, err := pgx.ForEachRow(rows, []any{&h.Resource, &h.Span.Lo, &h.Span.Hi, &h.Spot, &h.Reservation}, func() error {
				snap.Held = append(snap.Held, h)
				return nil
			})
			return err
		})
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return snap, fmt.Errorf("capacity: read node %s: %w", nodeID, err)
	}
	return snap, nil
}

func queueBookings(b *pgx.Batch, reservation string, member int, node string, picks []Pick, w window, spot bool) {
	n := len(picks)
	res, kinds, models := make([]string, n), make([]string, n), make([]string, n)
	lo, hi := make([]int32, n), make([]int32, n)
	units := make([]float64, n)
	for i, p := range picks {
		res[i], kinds[i], models[i], lo[i], hi[i], units[i] = p.Resource, p.Kind, p.Model, int32(p.Span.Lo), int32(p.Span.Hi), p.Units
	}
	b.Queue(`INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during, spot)
		SELECT $1, $2, $3, u.r, u.k, u.m, u.n, int4range(u.lo, u.hi), tstzrange($4, $5, '[)'), $6
		FROM unnest($7::text[], $8::text[], $9::text[], $10::float8[], $11::int[], $12::int[]) AS u(r, k, m, n, lo, hi)`,
		reservation, member, node, w.start, w.end, spot, res, kinds, models, units, lo, hi)
}

func describeShape(s api.Shape) string {
	var parts []string
	model := s.Model
	if model == "" {
		model = "any"
	}
	switch {
	case s.GPUs > 0:
		g := fmt.Sprintf("%d %s GPUs", s.GPUs, model)
		if s.NVLink {
			g += " in one NVLink domain"
		}
		parts = append(parts, g)
	case s.MIGProfile != "":
		parts = append(parts, "a "+s.MIGProfile+" slice of a "+model)
	case s.TimeSlice:
		parts = append(parts, "a time-slice share of a "+model)
	}
	if s.VCPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d vCPUs", s.VCPUs))
	}
	if s.MemoryGiB > 0 {
		parts = append(parts, fmt.Sprintf("%d GiB", s.MemoryGiB))
	}
	return strings.Join(parts, " + ")
}

func migProfileError(model, profile string) error {
	var names []string
	for _, p := range MIGProfiles(model) {
		names = append(names, p.Profile)
	}
	if len(names) == 0 {
		return api.InvalidField("migProfile", "GPU model %q has no MIG profiles", model)
	}
	return api.InvalidField("migProfile", "GPU model %q has no MIG profile %q; it has %s", model, profile, strings.Join(names, ", "))
}

func labelsOrEmpty(l map[string]string) map[string]string {
	if l == nil {
		return map[string]string{}
	}
	return l
}

func isAPIError(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}

func uniq(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
