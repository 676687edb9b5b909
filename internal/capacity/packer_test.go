package capacity

import (
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
)

// benchNodes is what a batch of calls locks under load: as many nodes as calls, 8 GPUs in one
// NVLink domain each, used GPUs held now by bookings of other reservations.
func benchNodes(n, used int, now time.Time) []NodeSnapshot {
	snaps := make([]NodeSnapshot, n)
	for i := range snaps {
		s := NodeSnapshot{NodeID: fmt.Sprintf("node-%03d", i), Name: fmt.Sprintf("node-%03d", i)}
		for g := range 8 {
			s.GPUs = append(s.GPUs, GPUState{Index: g, UUID: fmt.Sprintf("GPU-%d-%d", i, g), Model: "h100", Domain: fmt.Sprintf("nv-%d", i),
				Mode: api.GPUModeWhole, Healthy: true})
		}
		for g := range used {
			s.Held = append(s.Held, Held{Resource: "gpu", Span: GPUSpan(g), Reservation: fmt.Sprintf("r-%d-%d", i, g), From: now.Add(-time.Hour)})
		}
		snaps[i] = s
	}
	return snaps
}

// BenchmarkPackBatch plans a batch of calls for one whole H100 each, until released, over the
// nodes the batch locked: the Go side of reserveBatch.
func BenchmarkPackBatch(b *testing.B) {
	now := time.Date(2030, 3, 4, 10, 0, 0, 0, time.UTC)
	shape := api.Shape{GPUs: 1, Model: "h100"}
	for _, calls := range []int{8, 32} {
		for _, used := range []int{0, 4, 7} {
			b.Run(fmt.Sprintf("calls=%d/used=%d", calls, used), func(b *testing.B) {
				snaps := benchNodes(calls, used, now)
				w := window{start: now}
				for b.Loop() {
					fresh := make([]NodeSnapshot, len(snaps))
					for i, s := range snaps {
						fresh[i] = s
						fresh[i].Held = append([]Held(nil), s.Held...)
					}
					pk := newPacker(fresh, now)
					for range calls {
						j, plan, ok := pk.place(shape, w)
						if !ok {
							b.Fatal("no fit")
						}
						pk.take(j, plan.Picks, w)
					}
				}
			})
		}
	}
}
