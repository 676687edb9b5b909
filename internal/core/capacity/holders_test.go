package capacity_test

import (
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
)

func TestDevicesListAnswersHolders(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 4})
	node := f.nodes[0]
	now := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2}, Duration: "8h"})
	later := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 4}, Start: ptr(t0.Add(10 * time.Hour)), Duration: "1h"})
	devs, err := f.Compute.API.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: node.ID})
	if err != nil || len(devs) != 4 {
		t.Fatalf("devices.list = %+v, %v", devs, err)
	}
	held := map[int]bool{}
	for _, g := range now.Allocations[0].GPUs {
		held[g.Index] = true
	}
	for _, d := range devs {
		want := []api.DeviceHolder{}
		if held[d.Index] {
			want = append(want, api.DeviceHolder{Reservation: now.ID, TenantID: "root", State: api.ReservationActive, Kind: "gpu",
				Atoms: capacityAtoms(d.Index), From: t0, Until: ptr(t0.Add(8 * time.Hour))})
		}
		want = append(want, api.DeviceHolder{Reservation: later.ID, TenantID: "root", State: api.ReservationPending, Kind: "gpu",
			Atoms: capacityAtoms(d.Index), From: t0.Add(10 * time.Hour), Until: ptr(t0.Add(11 * time.Hour))})
		if diff := cmp.Diff(want, d.Holders); diff != "" {
			t.Errorf("holders of GPU %d (-want +got):\n%s", d.Index, diff)
		}
	}
	// A MIG slice names its own atoms; what has ended holds nothing.
	if _, err := f.Compute.API.Reservations.Cancel(f.ctx, f.RootKey, api.CancelReservation{Reservation: later.ID}); err != nil {
		t.Fatal(err)
	}
	free := devs[len(devs)-1]
	if held[free.Index] {
		t.Fatalf("GPU %d is held", free.Index)
	}
	if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: free.ID, Mode: api.GPUModeMIG}); err != nil {
		t.Fatal(err)
	}
	mig := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{MIGProfile: "3g.40gb", Model: "h100"}})
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: now.ID}); err != nil {
		t.Fatal(err)
	}
	devs, err = f.Compute.API.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: node.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		var want []api.DeviceHolder
		if d.Index == free.Index {
			want = []api.DeviceHolder{{Reservation: mig.ID, TenantID: "root", State: api.ReservationActive, Kind: "mig",
				Atoms: "[" + itoa(d.Index*64) + "," + itoa(d.Index*64+32) + ")", From: t0}}
		}
		if diff := cmp.Diff(want, d.Holders, cmpEmpty); diff != "" {
			t.Errorf("holders of GPU %d after the release (-want +got):\n%s", d.Index, diff)
		}
	}
}

func TestReservationsListByNode(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8, vcpus: 4})
	a := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}})
	b := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}})
	gang := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{VCPUs: 1}, Members: 2})
	onA := a.Allocations[0].NodeID
	for _, c := range []struct {
		node string
		want []string
	}{
		{onA, []string{a.ID, gang.ID}},
		{a.Allocations[0].Node, []string{a.ID, gang.ID}}, // by name
		{b.Allocations[0].NodeID, []string{b.ID, gang.ID}},
		{"no-such-node", nil},
		{"00000000-0000-0000-0000-000000000000", nil},
	} {
		page, err := f.Compute.API.Reservations.List(f.ctx, f.RootKey, api.ListReservations{Node: c.node})
		if err != nil {
			t.Fatalf("list --node %s: %v", c.node, err)
		}
		var got []string
		for _, r := range page.Items {
			got = append(got, r.ID)
		}
		if diff := cmp.Diff(sorted(c.want), sorted(got)); diff != "" {
			t.Errorf("list --node %s (-want +got):\n%s", c.node, diff)
		}
	}
	if _, err := f.Compute.API.Reservations.List(f.ctx, f.RootKey, api.ListReservations{Node: string(make([]byte, 300))}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a 300-byte node = %v, want invalid_argument", err)
	}
}

func TestReservationRecordsWhyItEnded(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8})
	get := func(id string) api.Reservation {
		t.Helper()
		r, err := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	released := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: released.ID}); err != nil {
		t.Fatal(err)
	}
	cancelled := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Start: ptr(t0.Add(time.Hour)), Duration: "1h"})
	if _, err := f.Compute.API.Reservations.Cancel(f.ctx, f.RootKey, api.CancelReservation{Reservation: cancelled.ID}); err != nil {
		t.Fatal(err)
	}
	expired := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "1h"})
	spot := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 6}, Spot: true})
	if r := get(spot.ID); r.EndReason != "" || r.EndedBy != "" {
		t.Fatalf("a live reservation has an end reason: %+v", r)
	}
	// Fill what is free so that the normal booking must take the spot holder's GPUs.
	var taker api.Reservation
	for {
		r, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if got := get(spot.ID); got.State == api.ReservationPreempted {
			taker = r
			break
		}
	}
	f.DB.SetNow(t0.Add(90 * time.Minute))
	if _, err := capacity.Tick(f.ctx, f.DB); err != nil {
		t.Fatal(err)
	}
	drained := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "4h"})
	drainedNode := drained.Allocations[0].NodeID
	if _, err := f.Compute.API.Nodes.Drain(f.ctx, f.RootKey, api.DrainNode{NodeRef: api.NodeRef{Node: drainedNode}, End: true}); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{
		released.ID:  {api.ReservationReleased, ""},
		cancelled.ID: {api.ReservationCancelled, ""},
		expired.ID:   {api.ReservationExpired, ""},
		spot.ID:      {api.ReservationPreempted, taker.ID},
		drained.ID:   {"drained", drainedNode},
	}
	for id, w := range want {
		if r := get(id); r.EndReason != w[0] || r.EndedBy != w[1] || r.EndedAt == nil {
			t.Errorf("reservation %s ended %s at %v by %q, want %s by %q", id, r.EndReason, r.EndedAt, r.EndedBy, w[0], w[1])
		}
	}
	page, err := f.Compute.API.Reservations.List(f.ctx, f.RootKey, api.ListReservations{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range page.Items {
		if w, ok := want[r.ID]; ok && (r.EndReason != w[0] || r.EndedBy != w[1]) {
			t.Errorf("reservations.list shows %s ended %s by %q, want %s by %q", r.ID, r.EndReason, r.EndedBy, w[0], w[1])
		}
	}
	// The drained reservation is still found by its node.
	page, err = f.Compute.API.Reservations.List(f.ctx, f.RootKey, api.ListReservations{Node: drainedNode, State: api.ReservationReleased})
	if err != nil || len(page.Items) == 0 {
		t.Fatalf("list --node of the drained node = %+v, %v", page, err)
	}
}

var cmpEmpty = cmpopts.EquateEmpty()

func capacityAtoms(gpu int) string { return fmt.Sprintf("[%d,%d)", gpu*64, gpu*64+64) }

func itoa(i int) string { return strconv.Itoa(i) }

func sorted(s []string) []string {
	out := append([]string{}, s...)
	sort.Strings(out)
	return out
}

func TestSpotShowsItsPreemptionAhead(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	spot := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Spot: true})
	normal := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Start: ptr(t0.Add(time.Hour)), Duration: "1h"})
	get := func() api.Reservation {
		r, err := f.Compute.API.Reservations.Get(f.ctx, f.RootKey, api.GetReservation{Reservation: spot.ID})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := get(); r.State != api.ReservationActive || r.EndReason != api.ReservationPreempted || r.EndedBy != normal.ID || !r.EndsAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("a spot reservation to be preempted at t0+1h = %+v", r)
	}
	f.DB.SetNow(t0.Add(time.Hour))
	if _, err := capacity.Tick(f.ctx, f.DB); err != nil {
		t.Fatal(err)
	}
	if r := get(); r.State != api.ReservationPreempted || r.EndReason != api.ReservationPreempted || r.EndedBy != normal.ID {
		t.Fatalf("the spot reservation after its preemption = %+v", r)
	}
}
