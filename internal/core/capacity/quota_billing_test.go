package capacity_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
)

func TestQuotaHoldsUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 4, gpus: 8})
	tenant, key := f.Tenant(t, "acme")
	// The platform (root) sets acme's quota in its pool; acme cannot raise it itself.
	if _, err := f.Compute.API.Quotas.Set(f.ctx, key, api.SetQuota{TenantID: tenant, Pool: "gpu", Resource: api.QuotaGPUs, Model: "h100", Limit: 100}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("a tenant setting its own quota = %v, want not_found (it cannot see the platform's tenant)", err)
	}
	q, err := f.Compute.API.Quotas.Set(f.ctx, f.RootKey, api.SetQuota{TenantID: tenant, Pool: "gpu", Resource: api.QuotaGPUs, Model: "h100", Limit: 8})
	if err != nil || q.Limit != 8 || q.Used != 0 {
		t.Fatalf("quotas.set = %+v, %v", q, err)
	}
	// Ten concurrent requests of 2 GPUs against a quota of 8: exactly four succeed.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[api.Code]int{}
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// acme reserves from its parent's pool by name.
			_, err := f.Compute.API.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 2}})
			mu.Lock()
			codes[api.CodeOf(err)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if codes[""] != 4 || codes[api.CodeQuotaExceeded] != 6 {
		t.Fatalf("outcomes %v, want 4 successes and 6 quota_exceeded", codes)
	}
	list, err := f.Compute.API.Quotas.List(f.ctx, key, api.ListQuotas{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Used != 8 {
		t.Fatalf("acme's quotas = %+v, %v", list, err)
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT coalesce(sum(upper(atoms) - lower(atoms)), 0) / 64 FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id WHERE r.tenant_id = $1`, tenant); n != 8 {
		t.Fatalf("acme holds %d GPUs, want 8", n)
	}
	_, err = f.Compute.API.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 1}})
	ae, _ := err.(*api.Error)
	if ae == nil || ae.Code != api.CodeQuotaExceeded || ae.Details["limit"] != 8 || ae.Details["used"] != 8 {
		t.Fatalf("over quota = %v, want quota_exceeded naming limit 8 and usage 8", err)
	}
	// Releasing gives the quota back.
	page, _ := f.Compute.API.Reservations.List(f.ctx, key, api.ListReservations{State: api.ReservationActive})
	if _, err := f.Compute.API.Reservations.Release(f.ctx, key, api.ReleaseReservation{Reservation: page.Items[0].ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Compute.API.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 2}}); err != nil {
		t.Fatalf("after a release, within quota again: %v", err)
	}
	// Tenant isolation: acme cannot see root's reservations; root sees acme's by naming it.
	if _, err := f.Compute.API.Reservations.Get(f.ctx, key, api.GetReservation{Reservation: page.Items[0].ID}); err != nil {
		t.Fatalf("acme reads its own: %v", err)
	}
	mine := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}})
	if _, err := f.Compute.API.Reservations.Get(f.ctx, key, api.GetReservation{Reservation: mine.ID}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("acme reads root's reservation: %v", err)
	}
	if _, err := f.Compute.API.Reservations.Release(f.ctx, key, api.ReleaseReservation{Reservation: mine.ID}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("acme releases root's reservation: %v", err)
	}
}

func TestBillingOnReservedTime(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8, vcpus: 32, mem: 128})
	f.DB.SetNow(t0.Add(15 * time.Minute)) // 10:15
	r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2, VCPUs: 4}, Duration: "4h"})

	// At 11:40 the hour 10:15-11:00 has closed; 11:00-11:40 has not.
	f.DB.SetNow(t0.Add(100 * time.Minute))
	res, err := capacity.Bill(f.ctx, f.DB, f.IAM)
	if err != nil || res.Records != 2 {
		t.Fatalf("bill at 11:40 = %+v, %v; want 2 records (GPU and vCPU, 10:15-11:00)", res, err)
	}
	total, n, _ := f.IAM.UsageTotal(f.ctx, "root", "gpu.h100.hours")
	if n != 1 || math.Abs(total-1.5) > 1e-6 {
		t.Fatalf("gpu.h100.hours = %v in %d records, want 1.5 (2 GPUs × 45 min)", total, n)
	}
	// A rerun bills nothing new; neither does a crash that lost billed_until.
	if res, err := capacity.Bill(f.ctx, f.DB, f.IAM); err != nil || res.Records != 0 {
		t.Fatalf("rerun = %+v, %v", res, err)
	}
	if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.bookings SET billed_until = NULL`); err != nil {
		t.Fatal(err)
	}
	if res, err := capacity.Bill(f.ctx, f.DB, f.IAM); err != nil || res.Records != 0 || res.Duplicates != 2 {
		t.Fatalf("rerun after losing the cursor = %+v, %v; want only duplicates", res, err)
	}
	// Released early at 11:40: the partial hour 11:00-11:40 is billed, and nothing after.
	if _, err := f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	f.DB.SetNow(t0.Add(10 * time.Hour))
	if _, err := capacity.Bill(f.ctx, f.DB, f.IAM); err != nil {
		t.Fatal(err)
	}
	total, _, _ = f.IAM.UsageTotal(f.ctx, "root", "gpu.h100.hours")
	want := 2 * (85.0 / 60) // 10:15 to 11:40
	if math.Abs(total-want) > 1e-6 {
		t.Fatalf("gpu.h100.hours after an early release = %v, want %v", total, want)
	}
	vcpu, _, _ := f.IAM.UsageTotal(f.ctx, "root", "vcpu.hours")
	if math.Abs(vcpu-4*(85.0/60)) > 1e-6 {
		t.Fatalf("vcpu.hours = %v", vcpu)
	}
}

// TestBillingReachesEveryBooking pins a starvation: a run picked the first bookings by id whether
// or not any of their hours had closed, so with more open bookings than a batch (billBatch) the
// ones after them were never billed.
func TestBillingReachesEveryBooking(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	f.DB.SetNow(t0) // 10:00
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "10h"})
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "10h"})
	f.DB.SetNow(t0.Add(30 * time.Minute))
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "10h"}) // the last booking by id

	// 11:10, a batch of two: the first two bookings' hour 10:00-11:00 is billed.
	f.DB.SetNow(t0.Add(70 * time.Minute))
	if res, err := capacity.BillIn(f.ctx, f.DB, f.IAM, 2); err != nil || res.Records != 2 {
		t.Fatalf("first run = %+v, %v; want 2 records", res, err)
	}
	// 11:20: the first two have nothing closed (11:00-12:00 runs); the third's 10:30-11:00 must come.
	f.DB.SetNow(t0.Add(80 * time.Minute))
	if res, err := capacity.BillIn(f.ctx, f.DB, f.IAM, 2); err != nil || res.Records != 1 {
		t.Fatalf("second run = %+v, %v; want the third booking's record", res, err)
	}
}
