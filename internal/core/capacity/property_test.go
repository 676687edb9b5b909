package capacity_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
)

// op is one random operation of the property test.
type op struct {
	kind   string // create, cancel, release, extend
	shape  api.Shape
	spot   bool
	start  int // minutes from now; 0 is now
	length int // minutes; 0 is until released
	target int // which earlier reservation, for cancel, release and extend
}

func genOp() *rapid.Generator[op] {
	return rapid.Custom(func(t *rapid.T) op {
		o := op{kind: rapid.SampledFrom([]string{"create", "create", "create", "cancel", "release", "extend"}).Draw(t, "kind")}
		switch rapid.IntRange(0, 3).Draw(t, "shape") {
		case 0:
			o.shape = api.Shape{GPUs: rapid.IntRange(1, 4).Draw(t, "gpus"), NVLink: rapid.Bool().Draw(t, "nvlink")}
		case 1:
			o.shape = api.Shape{GPUs: rapid.IntRange(1, 8).Draw(t, "gpus")}
		case 2:
			o.shape = api.Shape{VCPUs: rapid.IntRange(1, 12).Draw(t, "vcpus"), MemoryGiB: rapid.IntRange(0, 32).Draw(t, "mem")}
		default:
			o.shape = api.Shape{GPUs: 1, VCPUs: rapid.IntRange(1, 4).Draw(t, "vcpus")}
		}
		o.spot = rapid.IntRange(0, 3).Draw(t, "spot") == 0
		o.start = rapid.SampledFrom([]int{0, 0, 0, 30, 90}).Draw(t, "start")
		o.length = rapid.SampledFrom([]int{0, 60, 120}).Draw(t, "length")
		o.target = rapid.IntRange(0, 1000).Draw(t, "target")
		return o
	})
}

// TestPropertyNoAtomHeldTwice runs random operations from several goroutines at once, then checks
// with SQL that no atom was ever held twice at one instant, that quotas hold and match what is
// held, and that every node's rollup adds up to what its bookings say.
func TestPropertyNoAtomHeldTwice(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 3, gpus: 8, domains: 2, vcpus: 32, mem: 64})
	tenant, key := f.Tenant(t, "prop")
	if _, err := f.Compute.API.Quotas.Set(f.ctx, f.RootKey, api.SetQuota{TenantID: tenant, Pool: "gpu", Resource: api.QuotaGPUs, Limit: 12}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Compute.API.Quotas.Set(f.ctx, f.RootKey, api.SetQuota{TenantID: tenant, Pool: "gpu", Resource: api.QuotaVCPUs, Limit: 40}); err != nil {
		t.Fatal(err)
	}
	keys := []string{f.RootKey, key}
	// Each check runs dozens of concurrent transactions; 40 keep the suite quick. More with
	// -rapid.checks=N.
	checks := 0
	rapidCheck(t, 40, func(rt *rapid.T) {
		checks++
		// Start each check from an empty pool.
		if _, err := f.DB.Pool.Exec(f.ctx, `DELETE FROM compute.reservations; UPDATE compute.quotas SET used = 0`); err != nil {
			rt.Fatal(err)
		}
		for _, n := range f.nodes {
			if err := capacity.RefreshNodes(f.ctx, f.DB.Pool, n.ID); err != nil {
				rt.Fatal(err)
			}
		}
		const workers = 4
		plans := make([][]op, workers)
		for w := range workers {
			plans[w] = rapid.SliceOfN(genOp(), 5, 12).Draw(rt, fmt.Sprintf("ops%d", w))
		}
		var mu sync.Mutex
		var ids []string
		var unexpected []error
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := keys[w%2]
				for _, o := range plans[w] {
					var err error
					mu.Lock()
					target := ""
					if len(ids) > 0 {
						target = ids[o.target%len(ids)]
					}
					mu.Unlock()
					switch {
					case o.kind == "create":
						in := api.CreateReservation{Pool: "gpu", Shape: o.shape, Spot: o.spot}
						if o.start > 0 {
							in.Start = ptr(t0.Add(time.Duration(o.start) * time.Minute))
						}
						if o.length > 0 {
							in.Duration = fmt.Sprintf("%dm", o.length)
						}
						var r api.Reservation
						if r, err = f.Compute.API.Reservations.Create(f.ctx, k, in); err == nil {
							mu.Lock()
							ids = append(ids, r.ID)
							mu.Unlock()
						}
					case target == "":
						continue
					case o.kind == "cancel":
						_, err = f.Compute.API.Reservations.Cancel(f.ctx, k, api.CancelReservation{Reservation: target})
					case o.kind == "release":
						_, err = f.Compute.API.Reservations.Release(f.ctx, k, api.ReleaseReservation{Reservation: target})
					case o.kind == "extend":
						_, err = f.Compute.API.Reservations.Extend(f.ctx, k, api.ExtendReservation{Reservation: target, By: "30m"})
					}
					switch api.CodeOf(err) {
					case "", api.CodeConflict, api.CodeQuotaExceeded, api.CodeFailedPrecondition, api.CodeNotFound:
					default:
						mu.Lock()
						unexpected = append(unexpected, fmt.Errorf("%s: %w", o.kind, err))
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		for _, err := range unexpected {
			rt.Fatal(err)
		}
		checkInvariants(rt, f)
	})
	t.Logf("%d checks", checks)
}

func checkInvariants(rt *rapid.T, f *testFleet) {
	q := func(sql string) int {
		var n int
		if err := f.DB.Pool.QueryRow(f.ctx, sql).Scan(&n); err != nil {
			rt.Fatalf("%v\n%s", err, sql)
		}
		return n
	}
	if n := q(`SELECT count(*) FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id AND a.node_id = b.node_id
		AND a.resource = b.resource AND a.atoms && b.atoms AND a.during && b.during`); n != 0 {
		rt.Fatalf("%d pairs of bookings hold one atom at one instant", n)
	}
	// Every quota's count is what the tenant's live reservations claim, and within its limit.
	if n := q(`SELECT count(*) FROM compute.quotas qt WHERE used > "limit" OR used <> (
		  SELECT coalesce(sum(CASE qt.resource
		    WHEN 'gpus' THEN (SELECT coalesce(sum(value::int), 0) FROM jsonb_each_text(coalesce(r.claims->'gpus', '{}')) WHERE qt.model = '' OR key = qt.model)
		    WHEN 'vcpus' THEN coalesce((r.claims->>'vcpus')::int, 0)
		    ELSE coalesce((r.claims->>'memoryGiB')::int, 0) END), 0)
		  FROM compute.reservations r WHERE r.tenant_id = qt.tenant_id AND r.pool_id = qt.pool_id AND r.state IN ('pending', 'active'))`); n != 0 {
		rt.Fatalf("%d quotas do not match what is held, or are over their limit", n)
	}
	// Ended reservations hold nothing from their end on; live ones are consistent with their bookings.
	if n := q(`SELECT count(*) FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE r.state NOT IN ('pending', 'active') AND (upper_inf(b.during) OR upper(b.during) > r.ended_at)`); n != 0 {
		rt.Fatalf("%d bookings of ended reservations reach past the end", n)
	}
	// Each GPU is held by at most one booking now, and the rollup counts agree with the bookings.
	if n := q(`SELECT count(*) FROM compute.node_capacity nc WHERE nc.gpus_free + nc.gpus_spot + (
		  SELECT count(*) FROM compute.devices d WHERE d.node_id = nc.node_id AND d.mode = 'whole' AND EXISTS (
		    SELECT 1 FROM compute.bookings b WHERE b.node_id = d.node_id AND b.resource = 'gpu' AND NOT b.spot
		      AND b.during @> compute.compute_now() AND b.atoms && int4range(d.index * 64, d.index * 64 + 64))
		) <> nc.gpus_total`); n != 0 {
		rt.Fatalf("%d nodes' GPU rollups do not add up", n)
	}
	if n := q(`SELECT count(*) FROM compute.node_capacity nc WHERE nc.vcpus_used <> (
		  SELECT coalesce(sum(upper(atoms) - lower(atoms)), 0) FROM compute.bookings b
		  WHERE b.node_id = nc.node_id AND b.resource = 'cpu' AND NOT b.spot AND b.during @> compute.compute_now())`); n != 0 {
		rt.Fatalf("%d nodes' vCPU rollups disagree with their bookings", n)
	}
	// Spot never holds what a normal reservation holds (the constraint says so), and a preempted
	// reservation is always spot.
	if n := q(`SELECT count(*) FROM compute.reservations WHERE state = 'preempted' AND NOT spot`); n != 0 {
		rt.Fatalf("%d normal reservations were preempted", n)
	}
}
