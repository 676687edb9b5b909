package capacity_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
)

// TestNoExistenceOracle: a tenant that names a sibling's pool, reservation, node, device or the
// sibling itself gets the very answer it gets for one that does not exist, on every capacity and
// quota method, so that it cannot learn what another tenant has.
func TestNoExistenceOracle(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	env.DB.SetNow(t0)
	ctx := context.Background()
	a := env.Compute.API
	_, keyA := env.Tenant(t, "tenant-a")
	tenantB, keyB := env.Tenant(t, "tenant-b")
	poolB, err := a.Pools.Create(ctx, keyB, api.CreatePool{Name: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: poolB.ID, Name: "b-node"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, n.ID); err != nil {
		t.Fatal(err)
	}
	if err := capacity.SetInventory(ctx, env.DB.Pool, n.ID, capacity.Inventory{VCPUs: 8, MemoryGiB: 64, GPUs: []capacity.GPU{
		{Index: 0, UUID: "GPU-b-0", Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559},
		{Index: 1, UUID: "GPU-b-1", Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559},
	}}); err != nil {
		t.Fatal(err)
	}
	resB, err := a.Reservations.Create(ctx, keyB, api.CreateReservation{Pool: "secret", Shape: api.Shape{GPUs: 1}, Duration: "8h"})
	if err != nil {
		t.Fatal(err)
	}
	var devB string
	if err := env.DB.Pool.QueryRow(ctx, `SELECT id::text FROM compute.devices WHERE node_id = $1 AND index = 1`, n.ID).Scan(&devB); err != nil {
		t.Fatal(err)
	}
	const noTenant = "tenant-none"
	missing := fleet.NewID()
	start, end := t0.Add(time.Hour), t0.Add(2*time.Hour)

	type pair struct {
		real, none       func() error
		realRef, noneRef string
	}
	e := func(_ any, err error) error { return err }
	cases := map[string]pair{}
	// Each method, with the sibling's pool (by name in the sibling, by id in the caller's own
	// tenant) against a pool that does not exist.
	for _, how := range []struct {
		name            string
		tenant, ref, no string
	}{{"name in B", tenantB, "secret", "nothere"}, {"id", "", poolB.ID, missing}} {
		pool := func(ref string) (string, string) { return how.tenant, ref }
		add := func(method string, call func(ref string) error) {
			cases[method+" pool by "+how.name] = pair{func() error { return call(how.ref) }, func() error { return call(how.no) }, how.ref, how.no}
		}
		add("reservations.create", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Reservations.Create(ctx, keyA, api.CreateReservation{TenantID: tn, Pool: p, Shape: api.Shape{GPUs: 1}}))
		})
		add("reservations.list", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Reservations.List(ctx, keyA, api.ListReservations{TenantID: tn, Pool: p}))
		})
		add("reservations.availability", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Reservations.Availability(ctx, keyA, api.Availability{TenantID: tn, Pool: p, Shape: api.Shape{GPUs: 1}, Duration: "1h"}))
		})
		add("devices.map", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Devices.Map(ctx, keyA, api.MapDevices{TenantID: tn, Pool: p}))
		})
		add("capacity.summary", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Capacity.Summary(ctx, keyA, api.SummarizeCapacity{TenantID: tn, Pool: p}))
		})
		add("capacity.search", func(ref string) error {
			tn, p := pool(ref)
			return e(a.Capacity.Search(ctx, keyA, api.SearchCapacity{TenantID: tn, Pool: p, Start: start, End: end}))
		})
		add("quotas.set", func(ref string) error {
			tn, p := pool(ref)
			if tn == "" {
				tn = tenantB
			}
			return e(a.Quotas.Set(ctx, keyA, api.SetQuota{TenantID: tn, Pool: p, Resource: api.QuotaGPUs, Limit: 100}))
		})
		add("quotas.delete", func(ref string) error {
			tn, p := pool(ref)
			if tn == "" {
				tn = tenantB
			}
			return e(a.Quotas.Delete(ctx, keyA, api.DeleteQuota{TenantID: tn, Pool: p, Resource: api.QuotaGPUs}))
		})
	}
	// The sibling tenant itself against one that does not exist.
	tenantCase := func(method string, call func(tenant string) error) {
		cases[method+" tenant"] = pair{func() error { return call(tenantB) }, func() error { return call(noTenant) }, tenantB, noTenant}
	}
	tenantCase("reservations.create", func(tn string) error {
		return e(a.Reservations.Create(ctx, keyA, api.CreateReservation{TenantID: tn, Pool: "secret", Shape: api.Shape{GPUs: 1}}))
	})
	tenantCase("reservations.list", func(tn string) error { return e(a.Reservations.List(ctx, keyA, api.ListReservations{TenantID: tn})) })
	tenantCase("quotas.list", func(tn string) error { return e(a.Quotas.List(ctx, keyA, api.ListQuotas{TenantID: tn})) })
	tenantCase("quotas.set", func(tn string) error {
		return e(a.Quotas.Set(ctx, keyA, api.SetQuota{TenantID: tn, Pool: "secret", Resource: api.QuotaGPUs, Limit: 100}))
	})
	tenantCase("quotas.delete", func(tn string) error {
		return e(a.Quotas.Delete(ctx, keyA, api.DeleteQuota{TenantID: tn, Pool: "secret", Resource: api.QuotaGPUs}))
	})
	tenantCase("devices.map", func(tn string) error { return e(a.Devices.Map(ctx, keyA, api.MapDevices{TenantID: tn})) })
	tenantCase("capacity.summary", func(tn string) error {
		return e(a.Capacity.Summary(ctx, keyA, api.SummarizeCapacity{TenantID: tn, Pool: "secret"}))
	})
	// The sibling's reservation, node and device against ones that do not exist.
	idCase := func(method, real string, call func(id string) error) {
		cases[method] = pair{func() error { return call(real) }, func() error { return call(missing) }, real, missing}
	}
	idCase("reservations.get", resB.ID, func(id string) error { return e(a.Reservations.Get(ctx, keyA, api.GetReservation{Reservation: id})) })
	idCase("reservations.cancel", resB.ID, func(id string) error {
		return e(a.Reservations.Cancel(ctx, keyA, api.CancelReservation{Reservation: id}))
	})
	idCase("reservations.release", resB.ID, func(id string) error {
		return e(a.Reservations.Release(ctx, keyA, api.ReleaseReservation{Reservation: id}))
	})
	idCase("reservations.extend", resB.ID, func(id string) error {
		return e(a.Reservations.Extend(ctx, keyA, api.ExtendReservation{Reservation: id, By: "1h"}))
	})
	idCase("devices.list", n.ID, func(id string) error { return e(a.Devices.List(ctx, keyA, api.ListDevices{Node: id})) })
	idCase("devices.setMode", devB, func(id string) error {
		return e(a.Devices.SetMode(ctx, keyA, api.SetGPUMode{Device: id, Mode: api.GPUModeWhole}))
	})

	// Every method of the capacity groups is covered.
	seen := map[string]bool{}
	for name := range cases {
		seen[strings.Fields(name)[0]] = true
	}
	for _, m := range api.CapacityMethods() {
		if !seen[m.FullName()] {
			t.Errorf("%s is not covered", m.FullName())
		}
	}

	normal := func(err error, ref string) string {
		if err == nil {
			return "<nil>"
		}
		ae, ok := err.(*api.Error)
		if !ok {
			return "not an api.Error: " + err.Error()
		}
		b, _ := json.Marshal(ae)
		return strings.ReplaceAll(string(b), ref, "REF")
	}
	for name, c := range cases {
		real, none := c.real(), c.none()
		if api.CodeOf(real) != api.CodeNotFound && api.CodeOf(real) != api.CodePermissionDenied {
			t.Errorf("%s on the sibling's: %v, want not_found or permission_denied", name, real)
		}
		if r, n := normal(real, c.realRef), normal(none, c.noneRef); r != n {
			t.Errorf("%s answers differently for the sibling's and for nothing:\n  sibling's: %s\n  nothing:   %s", name, r, n)
		}
	}
	// And nothing of B's changed.
	got, err := a.Reservations.Get(ctx, keyB, api.GetReservation{Reservation: resB.ID})
	if err != nil || got.State != api.ReservationActive || !got.EndsAt.Equal(*resB.EndsAt) {
		t.Fatalf("B's reservation after A's attempts = %+v, %v", got, err)
	}
	if q, err := a.Quotas.List(ctx, env.RootKey, api.ListQuotas{TenantID: tenantB}); err != nil || len(q.Items) != 0 {
		t.Fatalf("B's quotas after A's attempts = %+v, %v", q, err)
	}
}
