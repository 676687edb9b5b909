package capacity_test

import (
	"fmt"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/postgres"
)

// leaseOp is one random operation of TestPropertyMemoryAndDatabaseInterleaved.
type leaseOp struct {
	kind   string // memory, database (a create through either process), release, cordon
	shape  api.Shape
	end    string // "" or a duration
	target int    // which earlier reservation, or node
}

func genLeaseOp() *rapid.Generator[leaseOp] {
	return rapid.Custom(func(t *rapid.T) leaseOp {
		o := leaseOp{kind: rapid.SampledFrom([]string{"memory", "memory", "memory", "database", "database", "release", "release", "cordon"}).Draw(t, "kind")}
		o.shape = api.Shape{GPUs: rapid.IntRange(1, 4).Draw(t, "gpus"), NVLink: rapid.Bool().Draw(t, "nvlink"),
			Model: rapid.SampledFrom([]string{"", "h100"}).Draw(t, "model")}
		if o.kind == "database" && rapid.Bool().Draw(t, "other shape") {
			o.shape.VCPUs = rapid.IntRange(0, 4).Draw(t, "vcpus") // not batched: the ordinary path
		}
		o.end = rapid.SampledFrom([]string{"", "", "1h"}).Draw(t, "end")
		o.target = rapid.IntRange(0, 1000).Draw(t, "target")
		return o
	})
}

// TestPropertyMemoryAndDatabaseInterleaved runs random creates from memory (the lease holder),
// creates through the database (a second process with the placer off, batched shapes and
// others), releases through either, and cordons and uncordons, from several goroutines at once;
// then no two bookings overlap, every rollup equals a recount, and the holder placed from memory.
func TestPropertyMemoryAndDatabaseInterleaved(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 3, gpus: 8, domains: 2, vcpus: 16, mem: 64, lease: true})
	other := f.attach(t, -1)
	var mu sync.Mutex
	var placedFromMemory int64
	rapidCheck(t, 25, func(rt *rapid.T) {
		before := leasesOf(f.Compute).Stats().Placed
		if _, err := f.DB.Pool.Exec(f.ctx, `DELETE FROM compute.reservations; UPDATE compute.nodes SET state = 'active'`); err != nil {
			rt.Fatal(err)
		}
		for _, n := range f.nodes {
			if err := capacity.RefreshNodes(f.ctx, f.DB.Pool, n.ID); err != nil {
				rt.Fatal(err)
			}
		}
		const workers = 4
		plans := make([][]leaseOp, workers)
		for w := range workers {
			plans[w] = rapid.SliceOfN(genLeaseOp(), 6, 14).Draw(rt, fmt.Sprintf("ops%d", w))
		}
		var ids []string
		var unexpected []error
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for _, o := range plans[w] {
					mu.Lock()
					target := ""
					if len(ids) > 0 {
						target = ids[o.target%len(ids)]
					}
					mu.Unlock()
					var err error
					switch o.kind {
					case "memory", "database":
						c, key := f.Compute, f.RootKey
						if o.kind == "database" {
							c, key = other.Compute, other.RootKey
						}
						var r api.Reservation
						if r, err = c.API.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "gpu", Shape: o.shape, Duration: o.end}); err == nil {
							mu.Lock()
							ids = append(ids, r.ID)
							mu.Unlock()
						}
					case "release":
						if target == "" {
							continue
						}
						c := f.Compute
						if o.target%2 == 1 {
							c = other.Compute
						}
						_, err = c.API.Reservations.Release(f.ctx, f.RootKey, api.ReleaseReservation{Reservation: target})
					case "cordon":
						// A raw statement beside placements that lock the node's rows in another
						// order may be the deadlock's victim (40P01): it runs again, as the
						// envelope runs a call again.
						for attempt := 0; attempt < 8; attempt++ {
							_, err = f.DB.Pool.Exec(f.ctx, `UPDATE compute.nodes SET state = CASE state WHEN 'active' THEN 'cordoned' ELSE 'active' END WHERE id = $1`,
								f.nodes[o.target%len(f.nodes)].ID)
							if !postgres.Retryable(err) {
								break
							}
						}
					}
					switch api.CodeOf(err) {
					case "", api.CodeConflict, api.CodeFailedPrecondition:
					default:
						mu.Lock()
						unexpected = append(unexpected, fmt.Errorf("%s %+v: %w", o.kind, o.shape, err))
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for _, err := range unexpected {
			rt.Fatal(err)
		}
		checkInvariants(rt, f)
		drift, err := capacity.Drift(f.ctx, f.DB.Pool)
		if err != nil {
			rt.Fatal(err)
		}
		for _, d := range drift {
			rt.Errorf("rollup drift: %s", d)
		}
		placedFromMemory += leasesOf(f.Compute).Stats().Placed - before
	})
	s := leasesOf(f.Compute).Stats()
	t.Logf("lease holder: %+v", s)
	if placedFromMemory == 0 {
		t.Error("no call was placed from memory")
	}
}
