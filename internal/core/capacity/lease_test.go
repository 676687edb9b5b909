package capacity_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
)

// leaseRow reads pool's lease: who holds it, its epoch, whether it is live.
func (f *testFleet) leaseRow(t *testing.T) (holder string, epoch int64, live bool) {
	t.Helper()
	if err := f.DB.Pool.QueryRow(f.ctx, `SELECT holder, epoch, expires_at > now() FROM compute.pool_leases WHERE pool_id = $1`, f.pool.ID).
		Scan(&holder, &epoch, &live); err != nil {
		t.Fatal(err)
	}
	return holder, epoch, live
}

// attach starts a second control plane on f's database, as another process would be: lease
// is its PoolLeaseTTL (negative: the placer off).
func (f *testFleet) attach(t *testing.T, lease time.Duration) *computetest.Env {
	t.Helper()
	e := computetest.Attach(t, f.Env, computetest.Options{Mode: compute.ModeAPI,
		Configure: func(o *compute.Options) { o.PoolLeaseTTL = lease }})
	if err := e.Compute.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Compute.Stop(context.Background()) })
	return e
}

// TestLeaseIsTakenRenewedAndHandedOver: the process that places for a pool takes its lease (epoch
// 1) and keeps it by renewing; a second process does not get it meanwhile; a holder that stops
// gives it up and the other takes it at once; a holder that stops renewing without giving it up
// (a ghost row, as a killed process leaves) loses it to the waiting process within the lease time.
// Each handover increases the epoch.
func TestLeaseIsTakenRenewedAndHandedOver(t *testing.T) {
	// Not parallel: its lease takeovers are bounded in time, which tests beside it would slow.
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8, lease: true})
	a := leasesOf(f.Compute)
	if h, e, live := f.leaseRow(t); h != a.Holder() || e != 1 || !live {
		t.Fatalf("lease = %s, epoch %d, live %v; want %s's, epoch 1, live", h, e, live, a.Holder())
	}
	var expires time.Time
	if err := f.DB.Pool.QueryRow(f.ctx, `SELECT expires_at FROM compute.pool_leases`).Scan(&expires); err != nil {
		t.Fatal(err)
	}

	b := f.attach(t, leaseTTL)
	bl := leasesOf(b.Compute)
	ctx, cancel := context.WithTimeout(f.ctx, 2*leaseTTL)
	defer cancel()
	if err := bl.Await(ctx, f.pool.ID); err == nil {
		t.Fatal("a second process took a lease its holder renews")
	}
	var later time.Time
	if err := f.DB.Pool.QueryRow(f.ctx, `SELECT expires_at FROM compute.pool_leases`).Scan(&later); err != nil {
		t.Fatal(err)
	}
	if h, e, live := f.leaseRow(t); h != a.Holder() || e != 1 || !live || !later.After(expires.Add(leaseTTL)) {
		t.Fatalf("after two lease times: %s, epoch %d, live %v, expires %s (was %s); want still %s's, renewed", h, e, live, later, expires, a.Holder())
	}

	// The holder stops: it gives the lease up, and the waiting process takes it.
	if err := f.Compute.Stop(f.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	awaitLease(t, b.Compute, f.pool.ID)
	t.Logf("given up: taken over in %s", time.Since(stopped).Round(time.Millisecond))
	if h, e, _ := f.leaseRow(t); h != bl.Holder() || e != 2 {
		t.Fatalf("after the holder stopped: %s, epoch %d; want %s, epoch 2", h, e, bl.Holder())
	}

	// A holder that stops renewing without a word: a ghost takes the row for one lease time.
	if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.pool_leases SET holder = 'ghost', epoch = epoch + 1, taken_at = now(),
		expires_at = now() + $1::interval`, fmt.Sprintf("%d milliseconds", leaseTTL.Milliseconds())); err != nil {
		t.Fatal(err)
	}
	ghost := time.Now()
	// b hears at its next renewal that it lost the lease.
	computetest.Eventually(t, 5*leaseTTL, "b no longer trusting the lease it lost", func() bool { return !bl.Held(f.pool.ID) })
	awaitLease(t, b.Compute, f.pool.ID)
	took := time.Since(ghost)
	// The bound: the lease time, then one renewal round, then the load; five lease times is
	// generous on a busy CI machine and still says "within seconds".
	if took > 5*leaseTTL {
		t.Errorf("the lease was taken over %s after its holder stopped renewing; want within %s", took, 5*leaseTTL)
	}
	t.Logf("holder silent: taken over in %s (lease time %s)", took.Round(time.Millisecond), leaseTTL)
	if h, e, _ := f.leaseRow(t); h != bl.Holder() || e != 4 {
		t.Fatalf("after the ghost: %s, epoch %d; want %s, epoch 4", h, e, bl.Holder())
	}
	if s := bl.Stats(); s.Taken != 2 || s.Lost != 1 {
		t.Errorf("b's stats %+v, want 2 taken and 1 lost", s)
	}
}

// placed is where a reservation's first member landed: node name and GPU indexes.
func placed(r api.Reservation) string {
	return fmt.Sprintf("%s%v", r.Allocations[0].Node, gpuIndexes(r.Allocations[0]))
}

// TestMemoryPlacesAsTheDatabaseDoes: the same calls on two identical pools, one placed from
// memory by the lease holder, the other through the database, land on the same nodes and GPUs,
// releases between them included.
func TestMemoryPlacesAsTheDatabaseDoes(t *testing.T) {
	// Not parallel: its lease holder trusts its memory for a lease time, and a loaded machine's pause sends placements to the database, which the test counts.
	spec := fleetSpec{nodes: 4, gpus: 8, domains: 2}
	db := newFleet(t, spec)
	spec.lease = true
	mem := newFleet(t, spec)
	type step struct {
		in      api.CreateReservation
		release int // >0: release the step's reservation of that number (1-based) instead
	}
	steps := []step{
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 1}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 2, Model: "h100"}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 4, NVLink: true}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}, Duration: "1h"}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 3}}},
		{release: 2},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 2, NVLink: true}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 8}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 1}}},
		{release: 3},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 4, NVLink: true}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 1}, End: ptr(t0.Add(time.Hour))}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 5}}},
		{in: api.CreateReservation{Shape: api.Shape{GPUs: 2}}},
	}
	ids := map[*testFleet][]string{}
	creates := 0
	for i, s := range steps {
		var got []string
		for _, f := range []*testFleet{db, mem} {
			if s.release > 0 {
				if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: ids[f][s.release-1]}); err != nil {
					t.Fatal(err)
				}
				ids[f] = append(ids[f], "")
				continue
			}
			r := f.mustReserve(t, s.in)
			ids[f] = append(ids[f], r.ID)
			got = append(got, placed(r))
		}
		if s.release == 0 {
			creates++
			if got[0] != got[1] {
				t.Errorf("step %d (%+v): the database placed on %s, memory on %s", i+1, s.in.Shape, got[0], got[1])
			}
		}
	}
	if s := leasesOf(mem.Compute).Stats(); s.Placed != int64(creates) || s.NotInMemory != 0 || s.Refused != 0 {
		t.Errorf("the lease holder's stats %+v; want all %d placed from memory, none refused", s, creates)
	}
}

// TestStaleMemoryNeverDoubleBooks: memory that another writer got ahead of never books what the
// database holds, and still places (or answers no room) correctly.
func TestStaleMemoryNeverDoubleBooks(t *testing.T) {
	// Not parallel: its lease holder trusts its memory for a lease time, and a loaded machine's pause sends placements to the database, which the test counts.
	// Two nodes of two GPUs. The first placement takes GPU 0 of the node first in id order (a);
	// GPU 1 of a is then the best fit of the next.
	setup := func(t *testing.T, delta bool) (f *testFleet, l *capacity.Leases, a, b string) {
		f = newFleet(t, fleetSpec{nodes: 2, gpus: 2, lease: true})
		l = leasesOf(f.Compute)
		capacity.SetLeaseDelta(l, delta)
		r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
		a = r.Allocations[0].NodeID
		for _, n := range f.nodes {
			if n.ID != a {
				b = n.ID
			}
		}
		return f, l, a, b
	}
	noOverlap := func(t *testing.T, f *testFleet) {
		t.Helper()
		if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.bookings x JOIN compute.bookings y ON x.id < y.id AND x.node_id = y.node_id
			AND x.resource = y.resource AND x.atoms && y.atoms AND x.during && y.during`); n != 0 {
			t.Fatalf("%d pairs of bookings overlap", n)
		}
	}
	next := func(t *testing.T, f *testFleet, want string) {
		t.Helper()
		r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
		if got := r.Allocations[0].NodeID; got != want {
			t.Fatalf("placed on %s, want %s", got, want)
		}
		noOverlap(t, f)
	}

	t.Run("booking behind its back", func(t *testing.T) {
		f, l, a, b := setup(t, true)
		// GPU 1 of a, booked by SQL of its own: no rollup written, so no delta shows it.
		if _, err := f.DB.Pool.Exec(f.ctx, `WITH r AS (
			  INSERT INTO compute.reservations (id, tenant_id, pool_id, state, shape, members, starts_at, created_by)
			  VALUES (gen_random_uuid(), 'root', $1, 'active', '{}', 1, compute.compute_now(), 'test') RETURNING id)
			INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during)
			SELECT id, 0, $2, 'gpu', 'gpu', 'h100', 1, int4range(64, 128), tstzrange(compute.compute_now(), NULL) FROM r`, f.pool.ID, a); err != nil {
			t.Fatal(err)
		}
		next(t, f, b) // the constraint refuses GPU 1 of a; a is read again, and the call lands on b
		if s := l.Stats(); s.ConflictsByCode["23P01"] == 0 {
			t.Errorf("stats %+v: want a write refused by the exclusion constraint", s)
		}
		_ = capacity.RefreshNodes(f.ctx, f.DB.Pool, a) // for the rollup checks of other tests' habits
	})

	for _, delta := range []bool{false, true} {
		t.Run(fmt.Sprintf("node cordoned, delta %v", delta), func(t *testing.T) {
			f, l, a, b := setup(t, delta)
			if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.nodes SET state = 'cordoned' WHERE id = $1`, a); err != nil {
				t.Fatal(err)
			}
			before := l.Stats()
			next(t, f, b)
			next(t, f, b)
			s := l.Stats()
			refused := s.ConflictsByCode["BCL01"] - before.ConflictsByCode["BCL01"]
			switch {
			case !delta && refused == 0:
				t.Errorf("stats %+v: without the delta read, leaseLockSQL should have refused the write to the cordoned node", s)
			case delta && s.Refused != before.Refused:
				t.Errorf("stats %+v: with the delta read, memory should have known of the cordon before planning", s)
			}
			if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}}); api.CodeOf(err) != api.CodeConflict {
				t.Fatalf("a third GPU on the one schedulable node: %v, want conflict (no room)", err)
			}
		})

		t.Run(fmt.Sprintf("GPU unhealthy, delta %v", delta), func(t *testing.T) {
			f, l, a, b := setup(t, delta)
			if err := capacity.SetGPUHealth(f.ctx, f.DB.Pool, a, 1, "unhealthy"); err != nil {
				t.Fatal(err)
			}
			next(t, f, b)
			if s := l.Stats(); !delta && s.ConflictsByCode["BCL01"] == 0 {
				t.Errorf("stats %+v: without the delta read, leaseLockSQL should have refused the unhealthy GPU", s)
			}
		})

		t.Run(fmt.Sprintf("release elsewhere, delta %v", delta), func(t *testing.T) {
			f, l, a, _ := setup(t, delta)
			other := f.attach(t, -1) // places through the database
			var last api.Reservation
			for range 3 {
				last = f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
			}
			before := l.Stats()
			if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}}); api.CodeOf(err) != api.CodeConflict {
				t.Fatalf("a fifth GPU of four: %v, want conflict", err)
			}
			if s := l.Stats(); s.NotInMemory != before.NotInMemory+1 {
				t.Errorf("stats %+v: the full pool's no room should have been confirmed by the database path", s)
			}
			if _, err := other.Compute.API.Reservations.Release(f.ctx, other.RootKey, api.ReleaseReservation{Reservation: last.ID}); err != nil {
				t.Fatal(err)
			}
			before = l.Stats()
			r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
			if placed(r) != placed(last) {
				t.Errorf("placed on %s, want the GPU released elsewhere, %s", placed(r), placed(last))
			}
			s := l.Stats()
			switch {
			case delta && s.Placed != before.Placed+1:
				t.Errorf("stats %+v: with the delta read, memory should have known of the release", s)
			case !delta && s.NotInMemory != before.NotInMemory+1:
				t.Errorf("stats %+v: without the delta read, the database path should have found the released GPU", s)
			}
			noOverlap(t, f)
			_ = a
		})
	}
}

// TestLeaseHolderAnswersAsBefore: what a placement from memory answers and writes is what the
// database path would: the reservation as reservations.get reads it back, its events, the rollups.
func TestLeaseHolderAnswersAsBefore(t *testing.T) {
	// Not parallel: its lease holder trusts its memory for a lease time, and a loaded machine's pause sends placements to the database, which the test counts.
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8, lease: true})
	r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2, Model: "h100"}, Duration: "2h", Labels: map[string]string{"team": "a"}})
	got, err := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if placed(got) != placed(r) || got.State != api.ReservationActive || got.EndsAt == nil || !got.EndsAt.Equal(t0.Add(2*time.Hour)) ||
		got.Labels["team"] != "a" || !slices.Equal(gpuIndexes(got.Allocations[0]), []int{0, 1}) {
		t.Fatalf("answered %+v, read back %+v", r, got)
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'reservation.created' AND subject = $1`, r.ID); n != 1 {
		t.Errorf("%d reservation.created events, want 1", n)
	}
	if d, err := capacity.Drift(f.ctx, f.DB.Pool); err != nil || len(d) != 0 {
		t.Errorf("drift %v %v", d, err)
	}
	if s := leasesOf(f.Compute).Stats(); s.Placed != 1 {
		t.Errorf("stats %+v, want 1 placed from memory", s)
	}
}
