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
	"github.com/better-compute/compute/internal/core/fleet"
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

// farFuture stands for "until released" when a window needs an end.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// endOr is the end of a window for overlap tests: far in the future when there is none.
func endOr(t *time.Time) time.Time {
	if t == nil {
		return farFuture
	}
	return *t
}

// dbNow reads compute_now(): every decision about time is the database's.
func dbNow(ctx context.Context, q postgres.Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&t)
	return t, err
}

// startGrace is how far in the past a start may be and be taken as now: a caller's clock and
// the database's differ, and a request takes time to arrive.
const startGrace = time.Minute

// requestWindow turns a request's start, duration and end into a window, against now.
func requestWindow(now time.Time, start *time.Time, duration string, end *time.Time) (window, error) {
	w := window{start: now}
	if start != nil {
		if start.Before(now.Add(-startGrace)) {
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

// plus is c and o together.
func (c claims) plus(o claims) claims {
	out := claims{VCPUs: c.VCPUs + o.VCPUs, MemoryGiB: c.MemoryGiB + o.MemoryGiB}
	for _, gpus := range []map[string]int{c.GPUs, o.GPUs} {
		for m, n := range gpus {
			if out.GPUs == nil {
				out.GPUs = map[string]int{}
			}
			out.GPUs[m] += n
		}
	}
	return out
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
	return reserveAvoiding(ctx, c, in, nil)
}

// reserveAvoiding is reserve on none of the nodes avoid names (modules.Capacity.Reserve's).
func reserveAvoiding(ctx context.Context, c *modules.Call, in api.CreateReservation, avoid []string) (api.Reservation, error) {
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
	var members []memberPlan
	used := append([]string{}, avoid...) // a member's node is not another's, nor one to avoid
	for m := range in.MemberCount() {
		p, err := r.placeMember(ctx, tx, used)
		if err != nil {
			return api.Reservation{}, err
		}
		if p == nil {
			return api.Reservation{}, r.noCapacity(ctx, tx, m)
		}
		members = append(members, *p)
		used = append(used, p.node.NodeID)
	}
	p := newPlacement(r.id, r.principal, in, w, now, members)
	if err := quotas.check(r.tenant, p.claims); err != nil {
		return api.Reservation{}, err
	}

	// Normal bookings end the spot bookings they overlap, in this transaction, before they are
	// written: the constraint would refuse them otherwise.
	write := newBookingWrite(r.tenant, r.pool, now)
	if preempt := p.preempts(); len(preempt) > 0 {
		nodes, victims, err := preemptSpot(ctx, tx, preempt, w.start, now, r.id)
		if err != nil {
			return api.Reservation{}, err
		}
		write.recountNodes(nodes...)
		// Quotas last: the victims' and this tenant's, all at once. This tenant's increments in
		// the write check the limits again under their row locks.
		if len(victims) > 0 {
			if err := lockQuotaSets(ctx, tx, quotaKeys(quotaKey{r.tenant, r.pool}, victims)...); err != nil {
				return api.Reservation{}, err
			}
			if err := releaseQuotas(ctx, tx, victims); err != nil {
				return api.Reservation{}, err
			}
		}
	}
	write.add(p)
	if err := write.send(ctx, tx, quotas); err != nil {
		return api.Reservation{}, err
	}
	return p.reservation(r.tenant, r.pool, now), nil
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
	q := filterQuery
	args := candidateArgs{Pool: r.pool, Model: r.in.Model, GPUs: r.in.GPUs, SpotFree: !r.in.Spot, VCPUs: r.in.VCPUs, Memory: r.in.MemoryGiB,
		Require: labelsOrEmpty(r.in.RequireLabels), Avoid: labelsOrEmpty(r.in.AvoidLabels), Now: nowPath, Kind: shapeKind(r.in.Shape), Limit: 1}
	if simple {
		args = candidateArgs{Pool: r.pool, Model: r.in.Model, GPUs: r.in.GPUs, Limit: 1}
	}
	pass := 0
	for range maxCandidates {
		args.Exclude = tried
		if simple {
			q = fitQuery(r.in.Model, passes[pass])
		}
		cands, err := lockCandidates(ctx, tx, q.skip, args)
		if err == nil && len(cands) == 0 {
			// Every candidate left is locked by another placer: wait for the best, for at most
			// placementWait. A placer that holds candidates already may so close a cycle with
			// another; PostgreSQL breaks it (40P01) and the envelope runs the call again (see
			// docs/capacity.md, "Lock order").
			cands, err = r.waitForCandidate(ctx, tx, q.wait, args)
		}
		if err != nil {
			return nil, fmt.Errorf("capacity: candidate: %w", err)
		}
		if len(cands) == 0 && simple && pass+1 < len(passes) {
			pass++
			continue
		}
		if len(cands) == 0 {
			return nil, nil
		}
		tried = append(tried, cands[0].id)
		snaps, err := loadSnapshots(ctx, tx, cands, r.w)
		if err != nil {
			return nil, err
		}
		if plan, ok := Plan(snaps[0], r.in.Shape, r.in.Spot); ok {
			return &memberPlan{snaps[0], plan}, nil
		}
	}
	return nil, nil
}

// placementWait bounds how long a placer waits for a node another placer holds. Past it the
// answer is no room, contended: under a storm of requests for the last free GPUs, a caller
// hears within seconds that it should try again, rather than queue behind every other.
const placementWait = time.Second

// waitForCandidate runs the candidate query q, one that waits for locked nodes, under placementWait.
func (r request) waitForCandidate(ctx context.Context, tx pgx.Tx, q string, args candidateArgs) ([]candidate, error) {
	var was string
	if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout'), set_config('lock_timeout', $1, true)`, placementWait.String()).Scan(&was, nil); err != nil {
		return nil, err
	}
	cands, err := lockCandidates(ctx, tx, q, args)
	if postgres.ErrorCode(err) == postgres.LockNotAvailable {
		return nil, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("pool %s has no room for %s now: the nodes that may fit stayed busy with concurrent requests for %s; try again", r.in.Pool, describeShape(r.in.Shape), placementWait),
			Details: map[string]any{"reason": NoRoomContended}}
	}
	if err != nil {
		return nil, err // the transaction is aborted
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, was); err != nil {
		return nil, err
	}
	return cands, nil
}

func describeShape(s api.Shape) string {
	var parts []string
	model := s.Model
	if model == "" {
		model = "GPU" // a MIG slice or a share names its model; whole GPUs may be of any
	}
	switch {
	case s.GPUs > 0:
		g := fmt.Sprintf("%d %s", s.GPUs, gpusOf(s.Model))
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
