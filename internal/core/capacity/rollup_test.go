package capacity_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
)

// rollupOp is one call of the rollup property test.
type rollupOp struct {
	kind    string // create, release, cancel, extend
	in      api.CreateReservation
	target  int
	byHours int
}

func genRollupOp() *rapid.Generator[rollupOp] {
	return rapid.Custom(func(t *rapid.T) rollupOp {
		o := rollupOp{kind: rapid.SampledFrom([]string{"create", "create", "create", "create", "release", "cancel", "extend"}).Draw(t, "kind")}
		o.target = rapid.IntRange(0, 1000).Draw(t, "target")
		var s api.Shape
		switch rapid.IntRange(0, 6).Draw(t, "shape") {
		case 0, 1: // the batched shape
			s = api.Shape{GPUs: rapid.IntRange(1, 3).Draw(t, "gpus")}
		case 2:
			s = api.Shape{GPUs: rapid.IntRange(1, 4).Draw(t, "gpus"), NVLink: true}
		case 3:
			s = api.Shape{MIGProfile: rapid.SampledFrom([]string{"1g.10gb", "3g.40gb"}).Draw(t, "mig"), Model: "h100"}
		case 4:
			s = api.Shape{TimeSlice: true, Model: "h100"}
		case 5:
			s = api.Shape{VCPUs: rapid.IntRange(1, 8).Draw(t, "vcpus"), MemoryGiB: rapid.IntRange(0, 16).Draw(t, "mem")}
		default:
			s = api.Shape{GPUs: 1, VCPUs: rapid.IntRange(1, 4).Draw(t, "vcpus")}
		}
		o.in = api.CreateReservation{Pool: "gpu", Shape: s}
		if rapid.IntRange(0, 5).Draw(t, "gang") == 0 && s.GPUs > 0 {
			o.in.Members = 2
		}
		o.in.Spot = rapid.IntRange(0, 3).Draw(t, "spot") == 0
		// Short reservations, so that the clock's steps end them.
		o.in.Duration = rapid.SampledFrom([]string{"", "10m", "20m", "45m"}).Draw(t, "duration")
		if start := rapid.SampledFrom([]int{0, 0, 0, 5, 25}).Draw(t, "start"); start > 0 {
			o.in.Start = &time.Time{} // filled in against the clock when it runs
			*o.in.Start = time.Time{}.Add(time.Duration(start) * time.Minute)
		}
		o.byHours = 1
		return o
	})
}

// TestPropertyRollupIsExact: rounds of concurrent calls of every shape (whole GPUs alone and
// batched, NVLink, MIG, time-slice, vCPU and memory, gangs, spot, future starts) with the clock
// moving between rounds, past reservations' ends and starts, before the worker has ticked. No
// call may fail because the rollup was wrong (the CHECK on node_capacity once answered valid
// requests with invalid_argument), no call may fail with internal or unavailable, and after
// each round's tick every node's rollup equals a recount from its bookings.
func TestPropertyRollupIsExact(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 4, gpus: 8, domains: 2, vcpus: 32, mem: 64})
	// One GPU of every node in MIG mode, one in time-slice mode: three kinds of GPU per node.
	for _, n := range f.nodes {
		devs, err := f.Compute.API.Devices.List(f.ctx, f.RootKey, api.ListDevices{Node: n.ID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[6].ID, Mode: api.GPUModeMIG}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Compute.API.Devices.SetMode(f.ctx, f.RootKey, api.SetGPUMode{Device: devs[7].ID, Mode: api.GPUModeTimeSlice, Shares: 4}); err != nil {
			t.Fatal(err)
		}
	}
	rapidCheck(t, 25, func(rt *rapid.T) {
		now := t0
		f.DB.SetNow(now)
		if _, err := f.DB.Pool.Exec(f.ctx, `DELETE FROM compute.reservations`); err != nil {
			rt.Fatal(err)
		}
		for _, n := range f.nodes {
			if err := capacity.RefreshNodes(f.ctx, f.DB.Pool, n.ID); err != nil {
				rt.Fatal(err)
			}
		}
		var ids []string
		rounds := rapid.IntRange(2, 5).Draw(rt, "rounds")
		for round := range rounds {
			const workers = 6
			var mu sync.Mutex
			var wg sync.WaitGroup
			var failures []string
			for w := range workers {
				ops := rapid.SliceOfN(genRollupOp(), 1, 4).Draw(rt, fmt.Sprintf("r%dw%d", round, w))
				wg.Go(func() {
					for _, o := range ops {
						mu.Lock()
						target := ""
						if len(ids) > 0 {
							target = ids[o.target%len(ids)]
						}
						mu.Unlock()
						var err error
						switch {
						case o.kind == "create":
							in := o.in
							if in.Start != nil {
								in.Start = ptr(now.Add(in.Start.Sub(time.Time{})))
							}
							var r api.Reservation
							if r, err = f.Compute.API.Reservations.Create(f.ctx, f.RootKey, in); err == nil {
								mu.Lock()
								ids = append(ids, r.ID)
								mu.Unlock()
							}
						case target == "":
						case o.kind == "release":
							_, err = f.Compute.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: target})
						case o.kind == "cancel":
							_, err = f.Compute.API.Reservations.Cancel(f.ctx, f.RootKey, api.CancelReservation{Reservation: target})
						case o.kind == "extend":
							_, err = f.Compute.API.Reservations.Extend(f.ctx, f.RootKey, api.ExtendReservation{Reservation: target, By: "15m"})
						}
						switch api.CodeOf(err) {
						case "", api.CodeFailedPrecondition, api.CodeNotFound:
						case api.CodeConflict:
							// No room is an answer; a conflict that names a constraint is the rollup lying.
							if e, ok := err.(*api.Error); ok && e.Details["constraint"] != nil {
								mu.Lock()
								failures = append(failures, fmt.Sprintf("%s %+v: %v", o.kind, o.in, err))
								mu.Unlock()
							}
						default:
							mu.Lock()
							failures = append(failures, fmt.Sprintf("%s %+v: %v", o.kind, o.in, err))
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			if len(failures) > 0 {
				rt.Fatalf("round %d: %d calls failed:\n%s", round, len(failures), strings.Join(failures, "\n"))
			}
			// The worker's tick applies the edges the clock passed; then nothing may disagree.
			if _, err := capacity.Tick(f.ctx, f.DB); err != nil {
				rt.Fatal(err)
			}
			checkRecount(rt, f)
			checkInvariants(rt, f)
			// The clock moves on, past some ends and starts, and the next round runs before a tick.
			now = now.Add(time.Duration(rapid.SampledFrom([]int{1, 7, 12, 30}).Draw(rt, fmt.Sprintf("step%d", round))) * time.Minute)
			f.DB.SetNow(now)
		}
	})
}

func checkRecount(rt *rapid.T, f *testFleet) {
	drift, err := capacity.Drift(f.ctx, f.DB.Pool)
	if err != nil {
		rt.Fatal(err)
	}
	var wrong []string
	for _, d := range drift {
		wrong = append(wrong, d.String())
	}
	if len(wrong) > 0 {
		rt.Fatal(strings.Join(wrong, "\n"))
	}
}

// TestRollupCountsAsOfItsStatement pins down what the storm test found: a transaction that began
// while a booking held and refreshed the node's rollup after the booking ended (having waited for
// the node's lock, say) counted the ended booking as held, because now() is the transaction's
// start. It runs on the real clock, which is what the fix is about.
func TestRollupCountsAsOfItsStatement(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 8})
	f.DB.ResetNow()
	r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1}, Duration: "1h"})
	tx, err := f.DB.Pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	if _, err := tx.Exec(f.ctx, `SELECT 1`); err != nil { // the transaction starts while the booking holds
		t.Fatal(err)
	}
	// The booking ends a moment after the transaction began, and the transaction goes on past the
	// end on the real clock, as the database reads it: the passing of time is what is under test.
	var end time.Time
	if err := f.DB.Pool.QueryRow(f.ctx, `UPDATE compute.bookings SET during = tstzrange(lower(during), pg_catalog.clock_timestamp() + interval '50 milliseconds')
		WHERE reservation_id = $1 RETURNING upper(during)`, r.ID).Scan(&end); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 10*time.Second, "the database's clock past the booking's end", func() bool {
		var past bool
		if err := tx.QueryRow(f.ctx, `SELECT pg_catalog.clock_timestamp() >= $1`, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	if err := capacity.RefreshNodes(f.ctx, tx, f.nodes[0].ID); err != nil {
		t.Fatal(err)
	}
	var free int
	if err := tx.QueryRow(f.ctx, `SELECT gpus_free FROM compute.node_capacity WHERE node_id = $1`, f.nodes[0].ID).Scan(&free); err != nil {
		t.Fatal(err)
	}
	if free != 8 {
		t.Fatalf("after the booking ended the refresh counts %d GPUs free, want 8", free)
	}
}
