package capacity_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
)

// written is what a placement leaves in the database, as its rows say.
type written struct {
	State, Shape, Claims, Labels string
	Spot                         bool
	Members                      int
	StartsAt                     time.Time
	EndsAt                       *time.Time
	Bookings                     []string // member, resource, kind, model, units, atoms, during, spot
	Event                        map[string]any
}

func (f *testFleet) written(t *testing.T, id string) written {
	t.Helper()
	var w written
	if err := f.DB.Pool.QueryRow(f.ctx, `SELECT state, shape::text, claims::text, labels::text, spot, members, starts_at, ends_at
		FROM compute.reservations WHERE id = $1`, id).Scan(&w.State, &w.Shape, &w.Claims, &w.Labels, &w.Spot, &w.Members, &w.StartsAt, &w.EndsAt); err != nil {
		t.Fatal(err)
	}
	rows, err := f.DB.Pool.Query(f.ctx, `SELECT format('%s %s %s %s %s %s %s %s', member, resource, kind, model, units, atoms, during, spot)
		FROM compute.bookings WHERE reservation_id = $1 ORDER BY member, resource, atoms`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		w.Bookings = append(w.Bookings, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	evs, err := events.About(f.ctx, f.DB.Pool, id)
	if err != nil || len(evs) != 1 || evs[0].Type != "reservation.created" || evs[0].TenantID != "root" {
		t.Fatalf("events of %s = %+v, %v; want one reservation.created", id, evs, err)
	}
	w.Event = evs[0].Data
	return w
}

// TestWrittenRows pins what the booking writer writes for a lone call (a gang with vCPUs, memory
// and labels; a spot reservation for later) and for calls that may share a batch.
func TestWrittenRows(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 4, vcpus: 16, mem: 64})
	end := t0.Add(time.Hour)

	gang := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100", VCPUs: 2, MemoryGiB: 4}, Members: 2,
		Duration: "1h", Labels: map[string]string{"team": "a"}})
	want := written{State: "active", Members: 2, StartsAt: t0, EndsAt: &end,
		Shape:  `{"gpus": 1, "model": "h100", "vcpus": 2, "memoryGiB": 4}`,
		Claims: `{"gpus": {"h100": 2}, "vcpus": 4, "memoryGiB": 8}`, Labels: `{"team": "a"}`,
		Bookings: []string{
			`0 cpu vcpu  2 [0,2) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
			`0 gpu gpu h100 1 [0,64) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
			`0 memory memory  4 [0,4) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
			`1 cpu vcpu  2 [0,2) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
			`1 gpu gpu h100 1 [0,64) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
			`1 memory memory  4 [0,4) ["2030-03-04 10:00:00+00","2030-03-04 11:00:00+00") f`,
		},
		Event: map[string]any{"pool": f.pool.ID, "state": "active", "spot": false}}
	if diff := cmp.Diff(want, f.written(t, gang.ID)); diff != "" {
		t.Errorf("a gang's rows (-want +got):\n%s", diff)
	}

	later := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2}, Spot: true, Start: &end})
	want = written{State: "pending", Spot: true, Members: 1, StartsAt: end,
		Shape: `{"gpus": 2}`, Claims: `{"gpus": {"h100": 2}}`, Labels: `{}`,
		Bookings: []string{`0 gpu gpu h100 2 [0,128) ["2030-03-04 11:00:00+00",) t`},
		Event:    map[string]any{"pool": f.pool.ID, "state": "pending", "spot": true}}
	if diff := cmp.Diff(want, f.written(t, later.ID)); diff != "" {
		t.Errorf("a later spot reservation's rows (-want +got):\n%s", diff)
	}

	// Calls of one batch key, at once: batched or alone, each is written the same.
	const calls = 4
	res := make([]api.Reservation, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			res[i], errs[i] = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}, Duration: "1h"})
		})
	}
	wg.Wait()
	for i, r := range res {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		got := f.written(t, r.ID)
		if len(got.Bookings) != 1 {
			t.Fatalf("bookings of %s = %v, want one", r.ID, got.Bookings)
		}
		got.Bookings = nil
		want := written{State: "active", Members: 1, StartsAt: t0, EndsAt: &end,
			Shape: `{"gpus": 1, "model": "h100"}`, Claims: `{"gpus": {"h100": 1}}`, Labels: `{}`,
			Event: map[string]any{"pool": f.pool.ID, "state": "active", "spot": false}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("a batchable call's rows (-want +got):\n%s", diff)
		}
	}
}
