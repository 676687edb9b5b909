package capacity_test

import (
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
)

// noRoom asserts that err is a no-room conflict for reason, whose message names the cause.
func noRoom(t *testing.T, err error, reason, says string) map[string]any {
	t.Helper()
	if api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("got %v, want a conflict for %s", err, reason)
	}
	ae := err.(*api.Error)
	if ae.Details["reason"] != reason || !strings.Contains(ae.Message, says) {
		t.Fatalf("got %q %v, want reason %s and a message that says %q", ae.Message, ae.Details, reason, says)
	}
	return ae.Details
}

func TestNoRoomNamesTheCause(t *testing.T) {
	t.Parallel()
	t.Run("a future booking in the way, and when it is free", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
		f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Start: ptr(t0.Add(2 * time.Hour)), Duration: "1h"})
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 8}, Duration: "4h"})
		d := noRoom(t, err, capacity.NoRoomFutureBooking, "a booking from 2030-03-04T12:00:00Z is in the way; it is free from 2030-03-04T13:00:00Z")
		if !d["freeAt"].(time.Time).Equal(t0.Add(3*time.Hour)) || !d["bookedFrom"].(time.Time).Equal(t0.Add(2*time.Hour)) {
			t.Fatalf("details %v", d)
		}
		// Two hours fit before it.
		f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 8}, Duration: "2h"})
	})
	t.Run("held now, free later", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
		f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 6}, Duration: "2h"})
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 4}, Duration: "1h"})
		d := noRoom(t, err, capacity.NoRoomBooked, "held by other reservations; it is free from 2030-03-04T12:00:00Z")
		if d["freeGPUs"] != 2 || !d["freeAt"].(time.Time).Equal(t0.Add(2*time.Hour)) {
			t.Fatalf("details %v", d)
		}
		// Held until released: no end in sight.
		f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2}})
		_, err = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 8}, Start: ptr(t0.Add(3 * time.Hour)), Duration: "1h"})
		if d := noRoom(t, err, capacity.NoRoomBooked, "not free within 30 days"); d["freeAt"] != nil {
			t.Fatalf("details %v", d)
		}
	})
	t.Run("no node with those labels", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 2, gpus: 8})
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}, RequireLabels: map[string]string{"zone": "b"}})
		if d := noRoom(t, err, capacity.NoRoomLabels, "no node has the labels asked for (zone=b)"); d["matchingLabels"] != 0 || d["nodes"] != 2 {
			t.Fatalf("details %v", d)
		}
	})
	t.Run("no GPUs of the model", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "a100"}})
		noRoom(t, err, capacity.NoRoomModel, "no node has a100 GPUs (the nodes have h100)")
	})
	t.Run("GPUs in the wrong mode", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 1, gpus: 2})
		devs, err := f.Compute.API.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: f.nodes[0].ID})
		if err != nil {
			t.Fatal(err)
		}
		// A MIG slice of GPUs in whole mode.
		_, err = f.reserve(api.CreateReservation{Shape: api.Shape{MIGProfile: "1g.10gb", Model: "h100"}})
		noRoom(t, err, capacity.NoRoomGPUMode, "are 2 in whole mode, and the request needs mig mode")
		// Whole GPUs of GPUs in MIG and time-slice mode.
		if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[0].ID, Mode: api.GPUModeMIG}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[1].ID, Mode: api.GPUModeTimeSlice, Shares: 4}); err != nil {
			t.Fatal(err)
		}
		_, err = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}})
		d := noRoom(t, err, capacity.NoRoomGPUMode, "are 1 in mig mode, 1 in timeslice mode, and the request needs whole mode")
		if d["modes"].(map[string]int)["mig"] != 1 || d["wantMode"] != api.GPUModeWhole {
			t.Fatalf("details %v", d)
		}
	})
	t.Run("no node large enough", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 2, gpus: 8, domains: 2})
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 16}})
		if d := noRoom(t, err, capacity.NoRoomTooLarge, "the largest have 8 GPUs,"); d["maxGPUs"] != 8 {
			t.Fatalf("details %v", d)
		}
		_, err = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 8, NVLink: true}})
		noRoom(t, err, capacity.NoRoomTooLarge, "NVLink")
		_, err = f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}, Members: 3})
		noRoom(t, err, capacity.NoRoomNoNodes, "only 2 nodes is in the pool, and the request needs 3")
	})
	t.Run("nodes offline, unhealthy or cordoned", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 3, gpus: 8})
		if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.nodes SET status = CASE WHEN id = $1 THEN 'offline' ELSE status END,
			health = CASE WHEN id = $2 THEN 'unhealthy' ELSE health END`, f.nodes[0].ID, f.nodes[1].ID); err != nil {
			t.Fatal(err)
		}
		if err := capacity.RefreshNodes(f.ctx, f.DB.Pool, f.nodes[0].ID, f.nodes[1].ID); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Compute.API.Nodes.Cordon(f.ctx, f.RootKey, api.CordonNode{NodeRef: api.NodeRef{Node: f.nodes[2].ID}}); err != nil {
			t.Fatal(err)
		}
		_, err := f.reserve(api.CreateReservation{Shape: api.Shape{GPUs: 1}})
		d := noRoom(t, err, capacity.NoRoomUnschedulable, "1 are offline, 1 unhealthy, 1 cordoned and 0 draining")
		if d["offline"] != 1 || d["cordoned"] != 1 {
			t.Fatalf("details %v", d)
		}
	})
	t.Run("quota", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
		tenant, key := f.Tenant(t, "small")
		if _, err := f.Compute.API.Quotas.Set(f.ctx, f.RootKey, api.SetQuota{TenantID: tenant, Pool: "gpu", Resource: api.QuotaGPUs, Limit: 1}); err != nil {
			t.Fatal(err)
		}
		_, err := f.Compute.API.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 2}})
		if api.CodeOf(err) != api.CodeQuotaExceeded || err.(*api.Error).Details["reason"] != "quota" {
			t.Fatalf("over quota = %v", err)
		}
		// The refusal is in the log, though the call's transaction was rolled back.
		evs, err := events.About(f.ctx, f.DB.Pool, tenant)
		if err != nil || len(evs) != 1 || evs[0].Type != "quota.exceeded" || evs[0].TenantID != tenant ||
			evs[0].Data["method"] != "reservations.create" || evs[0].Data["limit"] != float64(1) || evs[0].Data["requested"] != float64(2) {
			t.Fatalf("events about the tenant: %+v, %v; want one quota.exceeded", evs, err)
		}
	})
}
