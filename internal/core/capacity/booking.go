package capacity

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// memberPlan is what one member books, on the node it was planned on.
type memberPlan struct {
	node NodeSnapshot
	plan MemberPlan
}

// placement is one reservation as planned: what the writer writes and the call answers.
type placement struct {
	id, creator string
	in          api.CreateReservation
	w           window
	state       string
	members     []memberPlan
	claims      claims
}

func newPlacement(id, creator string, in api.CreateReservation, w window, now time.Time, members []memberPlan) placement {
	p := placement{id: id, creator: creator, in: in, w: w, state: api.ReservationPending, members: members}
	if !w.start.After(now) {
		p.state = api.ReservationActive
	}
	p.claims = claims{VCPUs: in.VCPUs * len(members), MemoryGiB: in.MemoryGiB * len(members)}
	for _, m := range members {
		for _, pk := range m.plan.Picks {
			if pk.Kind == "gpu" {
				if p.claims.GPUs == nil {
					p.claims.GPUs = map[string]int{}
				}
				p.claims.GPUs[pk.Model] += int(pk.Units)
			}
		}
	}
	return p
}

func (p placement) active() bool { return p.state == api.ReservationActive }

// preempts lists the spot reservations the members' picks overlap, once each.
func (p placement) preempts() []string {
	var ids []string
	for _, m := range p.members {
		ids = append(ids, m.plan.Preempts...)
	}
	return uniq(ids)
}

// reservation is the answer for p, once written.
func (p placement) reservation(tenant, pool string, now time.Time) api.Reservation {
	r := api.Reservation{
		ID: p.id, TenantID: tenant, PoolID: pool, State: p.state, Spot: p.in.Spot, Shape: p.in.Shape, Members: len(p.members),
		StartsAt: p.w.start, EndsAt: p.w.end, Labels: labelsOrEmpty(p.in.Labels), CreatedBy: p.creator, CreatedAt: now, UpdatedAt: now,
	}
	for _, m := range p.members {
		r.Allocations = append(r.Allocations, allocation(m.node.NodeID, m.node.Name, p.in.Shape, m.plan.Picks, m.node.GPUs))
	}
	return r
}

// bookingWrite is the one writer of placements, for a lone call (a batch of one) and a batch of
// calls alike. It runs after every lock but the quotas', in one round trip: one multi-row
// statement each for the reservations, their bookings, the recount of the nodes they change and
// the events, and one update per quota row they count against, which locks the row last (see
// docs/capacity.md, "Lock order").
type bookingWrite struct {
	tenant, pool string
	now          time.Time
	placed       []placement
	recount      map[string]bool // nodes whose rollups the write recounts
	stamp        map[string]bool // nodes of placements that start later: their rollups are marked (stampSQL)
	// counted are rollups the writer does not recount from the tables: a pool lease holder's
	// memory of the nodes, exact at the versions its lease check found, is counted instead
	// (leaseRollupSQL).
	counted []NodeSnapshot
}

func newBookingWrite(tenant, pool string, now time.Time) *bookingWrite {
	return &bookingWrite{tenant: tenant, pool: pool, now: now, recount: map[string]bool{}, stamp: map[string]bool{}}
}

// add writes p with the others. A placement that holds now changes its nodes' rollups; a later
// one does not until it starts (the worker's tick recounts then), and marks them instead.
func (w *bookingWrite) add(p placement) {
	w.placed = append(w.placed, p)
	for _, m := range p.members {
		if p.active() {
			w.recount[m.node.NodeID] = true
		} else {
			w.stamp[m.node.NodeID] = true
		}
	}
}

// recountNodes adds nodes whose bookings the transaction changed otherwise (spot it preempted).
// The caller holds their rollups' locks.
func (w *bookingWrite) recountNodes(nodes ...string) {
	for _, n := range nodes {
		w.recount[n] = true
	}
}

// send writes everything added. quotas are the rows the placements were checked against: their
// updates check the limits again under the rows' locks, and over a limit the write fails with
// quota_exceeded.
func (w *bookingWrite) send(ctx context.Context, tx pgx.Tx, quotas quotaRows) error {
	if len(w.placed) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	w.queue(b, quotas)
	err := tx.SendBatch(ctx, b).Close()
	switch {
	case err == nil:
		return nil
	case isAPIError(err):
		return err // over quota, counted under the rows' locks
	case postgres.ErrorCode(err) == postgres.ExclusionViolation:
		// Someone booked these atoms without the node lock (another path): try again afresh.
		return modules.Retry(&api.Error{Code: api.CodeConflict, Message: "the capacity chosen was booked concurrently; try again"})
	}
	return fmt.Errorf("capacity: write %d placements: %w", len(w.placed), err)
}

// queue queues send's statements in b.
func (w *bookingWrite) queue(b *pgx.Batch, quotas quotaRows) {
	var r struct {
		ids, states, creators []string
		spots                 []bool
		shapes                []api.Shape
		members               []int32
		claims                []claims
		starts                []time.Time
		ends                  []*time.Time
		labels                []map[string]string
		created               []map[string]any // the events' data
	}
	var bk struct {
		res, nodes, resources, kinds, models []string
		members, lo, hi                      []int32
		units                                []float64
		starts                               []time.Time
		ends                                 []*time.Time
		spots                                []bool
	}
	var total claims
	for _, p := range w.placed {
		r.ids = append(r.ids, p.id)
		r.states = append(r.states, p.state)
		r.creators = append(r.creators, p.creator)
		r.spots = append(r.spots, p.in.Spot)
		r.shapes = append(r.shapes, p.in.Shape)
		r.members = append(r.members, int32(len(p.members)))
		r.claims = append(r.claims, p.claims)
		r.starts = append(r.starts, p.w.start)
		r.ends = append(r.ends, p.w.end)
		r.labels = append(r.labels, labelsOrEmpty(p.in.Labels))
		r.created = append(r.created, map[string]any{"pool": w.pool, "state": p.state, "spot": p.in.Spot})
		total = total.plus(p.claims)
		for m, mp := range p.members {
			for _, pk := range mp.plan.Picks {
				bk.res = append(bk.res, p.id)
				bk.members = append(bk.members, int32(m))
				bk.nodes = append(bk.nodes, mp.node.NodeID)
				bk.resources = append(bk.resources, pk.Resource)
				bk.kinds = append(bk.kinds, pk.Kind)
				bk.models = append(bk.models, pk.Model)
				bk.units = append(bk.units, pk.Units)
				bk.lo = append(bk.lo, int32(pk.Span.Lo))
				bk.hi = append(bk.hi, int32(pk.Span.Hi))
				bk.starts = append(bk.starts, p.w.start)
				bk.ends = append(bk.ends, p.w.end)
				bk.spots = append(bk.spots, p.in.Spot)
			}
		}
	}
	b.Queue(`INSERT INTO compute.reservations (id, tenant_id, pool_id, state, spot, shape, members, claims, starts_at, ends_at, labels, created_by, created_at, updated_at)
		SELECT u.id, $1, $2, u.state, u.spot, u.shape, u.members, u.claims, u.starts, u.ends, u.labels, u.creator, $3, $3
		FROM unnest($4::uuid[], $5::text[], $6::bool[], $7::jsonb[], $8::int[], $9::jsonb[], $10::timestamptz[], $11::timestamptz[], $12::jsonb[], $13::text[])
		  AS u(id, state, spot, shape, members, claims, starts, ends, labels, creator)`,
		w.tenant, w.pool, w.now, r.ids, r.states, r.spots, r.shapes, r.members, r.claims, r.starts, r.ends, r.labels, r.creators)
	b.Queue(`INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during, spot)
		SELECT u.r, u.member, u.node, u.resource, u.kind, u.model, u.units, int4range(u.lo, u.hi), tstzrange(u.s, u.e, '[)'), u.spot
		FROM unnest($1::uuid[], $2::int[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::float8[], $8::int[], $9::int[],
		  $10::timestamptz[], $11::timestamptz[], $12::bool[])
		  AS u(r, member, node, resource, kind, model, units, lo, hi, s, e, spot)`,
		bk.res, bk.members, bk.nodes, bk.resources, bk.kinds, bk.models, bk.units, bk.lo, bk.hi, bk.starts, bk.ends, bk.spots)
	if len(w.counted) > 0 {
		queueLeaseRollups(b, w.counted)
		for _, n := range w.counted {
			delete(w.recount, n.NodeID)
		}
	}
	if nodes := sortedKeys(w.recount); len(nodes) > 0 {
		// Recounted, not decremented: see refreshSQL. The nodes are locked already.
		b.Queue(refreshSQL, nodes)
	}
	if nodes := sortedKeys(w.stamp); len(nodes) > 0 {
		b.Queue(stampSQL, nodes) // locked already, as the candidates they were
	}
	quotas.queue(b, w.tenant, w.pool, total) // quotas last
	events.QueueEmitMany(b, "reservation.created", w.tenant, r.ids, r.created)
}
