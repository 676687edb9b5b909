package capacity_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
)

func TestWholeGPUsPackToKeepNVLinkSetsWhole(t *testing.T) {
	t.Parallel()
	// One node, 8 GPUs in two NVLink domains of 4.
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8, domains: 2})
	a := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2, Model: "h100"}})
	if a.State != api.ReservationActive || len(a.Allocations) != 1 || !slices.Equal(gpuIndexes(a.Allocations[0]), []int{0, 1}) {
		t.Fatalf("first 2 GPUs: %+v", a)
	}
	// One more GPU goes to the half-used domain, not the whole one.
	b := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
	if got := gpuIndexes(b.Allocations[0]); !slices.Equal(got, []int{2}) {
		t.Fatalf("1 GPU landed on %v, want GPU 2 (packed into the used domain)", got)
	}
	// Four in one NVLink domain: only the untouched domain has them.
	c := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 4, NVLink: true}})
	if got := gpuIndexes(c.Allocations[0]); !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Fatalf("4 NVLink GPUs landed on %v, want 4-7", got)
	}
	for _, g := range c.Allocations[0].GPUs {
		if g.UUID == "" || g.Model != "h100" {
			t.Fatalf("allocated GPU without identity: %+v", g)
		}
	}
	// The last free GPU cannot make an NVLink pair.
	_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 2, NVLink: true}})
	if api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("2 NVLink GPUs with one free = %v, want conflict", err)
	}
	if d := err.(*api.Error).Details; d["reason"] != capacity.NoRoomBooked || d["freeGPUs"] != 1 {
		t.Fatalf("the conflict does not say what is free: %v", err)
	}
	s := f.summary(t)
	if len(s.Models) != 1 || s.Models[0].Total != 8 || s.Models[0].Used != 7 || s.Models[0].Free != 1 {
		t.Fatalf("summary = %+v, want 8 h100, 7 used, 1 free", s)
	}
	got, err := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: c.ID})
	if err != nil || !slices.Equal(gpuIndexes(got.Allocations[0]), []int{4, 5, 6, 7}) {
		t.Fatalf("get = %+v, %v", got, err)
	}
}

func TestMIGSlicesAndTimeSliceShares(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 2})
	devs, err := f.Compute.API.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: f.nodes[0].ID})
	if err != nil || len(devs) != 2 || devs[0].Model != "h100" || !slices.Contains(devs[0].MIGProfiles, "3g.40gb") {
		t.Fatalf("devices = %+v, %v", devs, err)
	}
	if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[0].UUID, Mode: api.GPUModeMIG}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[1].ID, Mode: api.GPUModeTimeSlice, Shares: 4}); err != nil {
		t.Fatal(err)
	}
	// Two 3g.40gb fill the MIG GPU; a third does not fit, nor does a 1g.10gb.
	for i, want := range []int{0, 4} {
		r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{MIGProfile: "3g.40gb", Model: "h100"}})
		g := r.Allocations[0].GPUs[0]
		if g.Index != 0 || g.MIGProfile != "3g.40gb" || g.MIGStart != want {
			t.Fatalf("3g.40gb #%d = %+v, want GPU 0 at slice %d", i, g, want)
		}
	}
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{MIGProfile: "1g.10gb", Model: "h100"}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("1g.10gb on a full MIG GPU = %v, want conflict", err)
	}
	// Four shares, each distinct, then none.
	seen := map[int]bool{}
	for range 4 {
		r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{TimeSlice: true, Model: "h100"}})
		g := r.Allocations[0].GPUs[0]
		if g.Index != 1 || g.Share == nil || seen[*g.Share] {
			t.Fatalf("share = %+v (seen %v)", g, seen)
		}
		seen[*g.Share] = true
	}
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{TimeSlice: true, Model: "h100"}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a fifth share = %v, want conflict", err)
	}
	// Neither GPU is whole: whole-GPU requests find nothing.
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a whole GPU = %v, want conflict", err)
	}
	// A mode change while held is refused.
	if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[1].ID, Mode: api.GPUModeWhole}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("mode change of a held GPU = %v, want failed_precondition", err)
	}
}

func TestVCPUsAndMemory(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 0, vcpus: 16, mem: 64})
	a := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{VCPUs: 6, MemoryGiB: 24}})
	b := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{VCPUs: 6, MemoryGiB: 24}})
	if a.Allocations[0].CPUSet != "0-5" || b.Allocations[0].CPUSet != "6-11" || b.Allocations[0].MemoryGiB != 24 {
		t.Fatalf("cpusets %q, %q", a.Allocations[0].CPUSet, b.Allocations[0].CPUSet)
	}
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{VCPUs: 6}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("6 of 4 free vCPUs = %v, want conflict", err)
	}
	// Free the first; a request for 8 takes the two holes as two ranges.
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: a.ID}); err != nil {
		t.Fatal(err)
	}
	f.DB.SetNow(t0.Add(time.Minute))
	c := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{VCPUs: 8}})
	if c.Allocations[0].CPUSet != "0-5,12-13" || c.Allocations[0].VCPUs != 8 {
		t.Fatalf("8 vCPUs over two holes = %q", c.Allocations[0].CPUSet)
	}
	s := f.summary(t)
	if s.VCPUs.Total != 16 || s.VCPUs.Used != 14 || s.MemoryGiB.Used != 24 {
		t.Fatalf("summary = %+v", s)
	}
}

func TestGangAllOrNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 3, gpus: 8})
	_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 8}, Members: 4})
	if api.CodeOf(err) != api.CodeConflict || err.(*api.Error).Details["membersPlaced"] != 3 {
		t.Fatalf("4×8 on 3 nodes = %v, want conflict after 3 members", err)
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.bookings`); n != 0 {
		t.Fatalf("a refused gang left %d bookings", n)
	}
	r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Members: 3})
	nodes := map[string]bool{}
	for _, a := range r.Allocations {
		nodes[a.NodeID] = true
		if len(a.GPUs) != 8 {
			t.Fatalf("member %+v", a)
		}
	}
	if len(nodes) != 3 || r.Members != 3 {
		t.Fatalf("the gang's members are on %d nodes, want 3", len(nodes))
	}
}

func TestSpotIsPreemptedNeverTheOtherWay(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	spot := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Spot: true})
	if s := f.summary(t); s.Models[0].Spot != 8 || s.Models[0].Free != 0 {
		t.Fatalf("summary with a spot holder = %+v", s)
	}
	// Spot never displaces anyone, spot included.
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}, Spot: true}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("spot over spot = %v, want conflict", err)
	}
	normal := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 4}})
	got, err := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: spot.ID})
	if err != nil || got.State != api.ReservationPreempted || got.EndedAt == nil {
		t.Fatalf("the spot reservation after a normal one took its GPUs = %+v, %v", got, err)
	}
	evs, err := events.About(f.ctx, f.DB.Pool, spot.ID)
	if err != nil || len(evs) != 2 || evs[1].Type != "reservation.preempted" || evs[1].Data["by"] != normal.ID {
		t.Fatalf("events of the spot reservation = %+v, %v", evs, err)
	}
	// Preempted means its bookings ended: the rest of the node is free again.
	if s := f.summary(t); s.Models[0].Used != 4 || s.Models[0].Spot != 0 || s.Models[0].Free != 4 {
		t.Fatalf("summary after preemption = %+v", s)
	}
	// A spot request over a normal holder is refused.
	if _, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 8}, Spot: true}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("spot over normal = %v, want conflict", err)
	}
}

func TestCalendarExpiryAndAvailability(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	now := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Duration: "2h"})
	if now.EndsAt == nil || !now.EndsAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("ends at %v", now.EndsAt)
	}
	// Over the next two hours there is nothing; at t0+2h there is.
	av, err := f.Compute.API.Reservations.Availability(f.ctx, f.RootKey, api.Availability{Pool: "gpu", Shape: api.Shape{GPUs: 8}, Duration: "1h"})
	if err != nil || !av.Found || !av.Start.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("availability = %+v, %v; want t0+2h", av, err)
	}
	later := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Start: av.Start, Duration: "1h"})
	if later.State != api.ReservationPending {
		t.Fatalf("a future reservation is %s, want pending", later.State)
	}
	// Now the earliest 8-GPU hour is after both.
	av, err = f.Compute.API.Reservations.Availability(f.ctx, f.RootKey, api.Availability{Pool: "gpu", Shape: api.Shape{GPUs: 8}, Duration: "1h"})
	if err != nil || !av.Start.Equal(t0.Add(3*time.Hour)) {
		t.Fatalf("availability after the second = %+v, %v; want t0+3h", av, err)
	}
	w, err := f.Compute.API.Capacity.Search(f.ctx, f.RootKey, api.SearchCapacity{Pool: "gpu", Start: t0.Add(4 * time.Hour), End: t0.Add(5 * time.Hour)})
	if err != nil || len(w.Models) != 1 || w.Models[0].Free != 8 || w.Models[0].LargestBlock != 8 {
		t.Fatalf("search t0+4h..5h = %+v, %v", w, err)
	}
	w, _ = f.Compute.API.Capacity.Search(f.ctx, f.RootKey, api.SearchCapacity{Pool: "gpu", Start: t0.Add(time.Hour), End: t0.Add(5 * time.Hour)})
	if w.Models[0].Free != 0 {
		t.Fatalf("search over booked hours = %+v", w)
	}
	// Time passes: the first expires, the second activates, then expires.
	f.DB.SetNow(t0.Add(2*time.Hour + time.Second))
	res, err := capacity.Tick(f.ctx, f.DB)
	if err != nil || res.Activated != 1 || res.Ended != 1 {
		t.Fatalf("tick at t0+2h = %+v, %v", res, err)
	}
	for id, want := range map[string]string{now.ID: api.ReservationExpired, later.ID: api.ReservationActive} {
		r, _ := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: id})
		if r.State != want {
			t.Fatalf("reservation %s is %s, want %s", id, r.State, want)
		}
	}
	if s := f.summary(t); s.Models[0].Used != 8 {
		t.Fatalf("summary with the second active = %+v", s)
	}
	f.DB.SetNow(t0.Add(3*time.Hour + time.Second))
	if res, err := capacity.Tick(f.ctx, f.DB); err != nil || res.Ended != 1 {
		t.Fatalf("tick at t0+3h = %+v, %v", res, err)
	}
	if s := f.summary(t); s.Models[0].Free != 8 {
		t.Fatalf("summary after both expired = %+v", s)
	}
}

func TestCancelExtendRelease(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	a := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 4}, Duration: "1h"})
	b := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 4}, Start: ptr(t0.Add(2 * time.Hour)), Duration: "1h"})
	if _, err := f.Compute.API.Reservations.Cancel(f.ctx, f.RootKey, api.CancelReservation{Reservation: a.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("cancel an active one = %v, want failed_precondition", err)
	}
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: b.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("release a pending one = %v, want failed_precondition", err)
	}
	// a (GPUs 0-3 until t0+1h) may grow while nothing is booked after it.
	ext, err := f.Compute.API.Reservations.Extend(f.ctx, f.RootKey, api.ExtendReservation{Reservation: a.ID, By: "30m"})
	if err != nil || !ext.EndsAt.Equal(t0.Add(90*time.Minute)) {
		t.Fatalf("extend = %+v, %v", ext, err)
	}
	c, err := f.Compute.API.Reservations.Cancel(f.ctx, f.RootKey, api.CancelReservation{Reservation: b.ID})
	if err != nil || c.State != api.ReservationCancelled || len(c.Allocations) != 0 {
		t.Fatalf("cancel = %+v, %v", c, err)
	}
	// A normal booking in the way refuses an extension.
	blocker := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Start: ptr(t0.Add(2 * time.Hour)), Duration: "1h"})
	if _, err := f.Compute.API.Reservations.Extend(f.ctx, f.RootKey, api.ExtendReservation{Reservation: a.ID, By: "1h"}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("extend into a booked window = %v, want conflict", err)
	}
	f.DB.SetNow(t0.Add(10 * time.Minute))
	rel, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: a.ID})
	if err != nil || rel.State != api.ReservationReleased || !rel.EndedAt.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("release = %+v, %v", rel, err)
	}
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: a.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("release twice = %v, want failed_precondition", err)
	}
	// The database refuses a transition the state table does not have.
	_, err = f.DB.Pool.Exec(f.ctx, `UPDATE compute.reservations SET state = 'active' WHERE id = $1`, a.ID)
	if err == nil {
		t.Fatal("released → active was accepted by the database")
	}
	_ = blocker
}

func TestBadRequestsBookNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	cases := map[string]api.CreateReservation{
		"unknown pool":        {Pool: "nowhere", Shape: api.Shape{GPUs: 1}},
		"nothing":             {},
		"zero GPUs":           {Shape: api.Shape{GPUs: 0}},
		"negative GPUs":       {Shape: api.Shape{GPUs: -2}},
		"negative vCPUs":      {Shape: api.Shape{VCPUs: -1}},
		"end before start":    {Shape: api.Shape{GPUs: 1}, Start: ptr(t0.Add(time.Hour)), End: ptr(t0)},
		"duration and end":    {Shape: api.Shape{GPUs: 1}, Duration: "1h", End: ptr(t0.Add(2 * time.Hour))},
		"bad duration":        {Shape: api.Shape{GPUs: 1}, Duration: "soon"},
		"negative duration":   {Shape: api.Shape{GPUs: 1}, Duration: "-1h"},
		"start in the past":   {Shape: api.Shape{GPUs: 1}, Start: ptr(t0.Add(-time.Hour))},
		"MIG the model lacks": {Shape: api.Shape{MIGProfile: "3g.40gb", Model: "l40s"}},
		"MIG no such profile": {Shape: api.Shape{MIGProfile: "5g.50gb", Model: "h100"}},
		"MIG without model":   {Shape: api.Shape{MIGProfile: "3g.40gb"}},
		"two kinds":           {Shape: api.Shape{GPUs: 1, TimeSlice: true, Model: "h100"}},
		"too many members":    {Shape: api.Shape{GPUs: 1}, Members: 100000},
		"NVLink without GPUs": {Shape: api.Shape{VCPUs: 2, NVLink: true}},
	}
	for name, in := range cases {
		_, err := f.reserve(in)
		code := api.CodeOf(err)
		if code != api.CodeInvalidArgument && !(name == "unknown pool" && code == api.CodeNotFound) {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		} else if err.(*api.Error).Message == "" {
			t.Errorf("%s: an error without a message", name)
		}
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.reservations`); n != 0 {
		t.Fatalf("bad requests made %d reservations", n)
	}
	_ = fmt.Sprint
}

// TestOneDecisionPerReservationMutation: each mutation, batched or not, asks IAM exactly once,
// with its own action; the lifecycle worker and billing never ask.
func TestOneDecisionPerReservationMutation(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8})
	check := func(what, action string, run func() error) {
		t.Helper()
		f.Counter.Reset()
		if err := run(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ds := f.Counter.Decisions()
		if len(ds) != 1 || ds[0].Action != action {
			t.Fatalf("%s made decisions %+v, want exactly one %s", what, ds, action)
		}
	}
	var r api.Reservation
	check("create (batched path)", "compute:reservations:create", func() (err error) {
		r, err = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 2}, Duration: "1h"})
		return err
	})
	check("extend", "compute:reservations:extend", func() error {
		_, err := f.Compute.API.Reservations.Extend(f.ctx, f.RootKey, api.ExtendReservation{Reservation: r.ID, By: "1h"})
		return err
	})
	check("create (alone path)", "compute:reservations:create", func() error {
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1, VCPUs: 0}, Start: ptr(t0.Add(3 * time.Hour))})
		return err
	})
	check("release", "compute:reservations:release", func() error {
		_, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: r.ID})
		return err
	})
	f.Counter.Reset()
	f.DB.SetNow(t0.Add(5 * time.Hour))
	if _, err := capacity.Tick(f.ctx, f.DB); err != nil {
		t.Fatal(err)
	}
	if _, err := capacity.Bill(f.ctx, f.DB, f.IAM); err != nil {
		t.Fatal(err)
	}
	if n := len(f.Counter.Decisions()) + f.Counter.Authentications(); n != 0 {
		t.Fatalf("the worker paths asked IAM %d times, want none", n)
	}
}
