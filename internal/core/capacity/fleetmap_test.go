package capacity_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/api"
)

func TestDevicesMapAnswersEachGPUNow(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 3, gpus: 2})
	a := f.Compute.API
	whole := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2}, Duration: "8h"})
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2}, Start: ptr(t0.Add(10 * time.Hour)), Duration: "1h"})
	spot := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Spot: true})
	// A GPU of the third node in time-slice mode, one share of it held.
	third := f.nodes[2]
	devs, err := a.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: third.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[1].ID, Mode: api.GPUModeTimeSlice, Shares: 4}); err != nil {
		t.Fatal(err)
	}
	share := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{TimeSlice: true, Model: "h100"}})

	// Pages of one node walk the fleet in id order; the pool's name or id filters it.
	var got []api.MapNode
	in := api.MapDevices{Pool: "gpu", Limit: 1}
	for {
		page, err := a.Devices.Map(f.ctx, f.RootKey, in)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page.Items...)
		if page.NextCursor == "" {
			break
		}
		in.Cursor = page.NextCursor
	}
	if len(got) != 3 {
		t.Fatalf("devices.map walked %d nodes, want 3", len(got))
	}
	held := map[string]map[int]api.MapGPU{}
	for _, n := range got {
		if n.PoolID != f.pool.ID || n.State != api.NodeActive || len(n.GPUs) != 2 {
			t.Errorf("node %s = %+v", n.Name, n)
		}
		held[n.ID] = map[int]api.MapGPU{}
		for _, g := range n.GPUs {
			held[n.ID][g.Index] = g
		}
	}
	for _, r := range []struct {
		res  api.Reservation
		want func(index int) api.MapGPU
	}{
		{whole, func(i int) api.MapGPU {
			return api.MapGPU{Index: i, Model: "h100", Mode: "whole", Health: "healthy", Held: 64, Holders: []string{whole.ID}}
		}},
		{spot, func(i int) api.MapGPU {
			return api.MapGPU{Index: i, Model: "h100", Mode: "whole", Health: "healthy", Held: 64, Holders: []string{spot.ID}, Spot: true}
		}},
		{share, func(i int) api.MapGPU {
			return api.MapGPU{Index: i, Model: "h100", Mode: "timeslice", Shares: 4, Health: "healthy", Held: 1, Holders: []string{share.ID}}
		}},
	} {
		al := r.res.Allocations[0]
		for _, g := range al.GPUs {
			if diff := cmp.Diff(r.want(g.Index), held[al.NodeID][g.Index]); diff != "" {
				t.Errorf("GPU %d of %s (-want +got):\n%s", g.Index, al.Node, diff)
			}
			delete(held[al.NodeID], g.Index)
		}
	}
	// What is left holds nothing now (the future booking is the timeline's, not the map's).
	for node, gpus := range held {
		for _, g := range gpus {
			if g.Held != 0 || len(g.Holders) != 0 {
				t.Errorf("GPU %d of node %s = %+v, want free", g.Index, node, g)
			}
		}
	}
	if _, err := a.Devices.Map(f.ctx, f.RootKey, api.MapDevices{Cursor: "nonsense"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("a bad cursor: %v, want invalid_argument", err)
	}
	if _, err := a.Devices.Map(f.ctx, f.RootKey, api.MapDevices{Limit: api.MaxMapLimit + 1}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("a limit too large: %v, want invalid_argument", err)
	}
}
