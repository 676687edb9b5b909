package capacity

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
)

// fromScratch is how a batch was planned before the packer: every call against every node's
// view over its window, planned anew. The packer must choose as it did.
func fromScratch(snaps []NodeSnapshot, shape api.Shape, w window) (node int, plan MemberPlan, ok bool) {
	best, bestFree := -1, 0
	for j := range snaps {
		view := during(snaps[j], w.start, endOr(w.end))
		pl, ok := Plan(view, shape, false)
		if !ok || len(pl.Preempts) > 0 {
			continue
		}
		if free := freeWhole(view); best < 0 || free < bestFree {
			best, bestFree, plan = j, free, pl
		}
	}
	return best, plan, best >= 0
}

// TestPackerChoosesAsFromScratch places random batches on random nodes (GPUs of two models, in
// other modes, unhealthy, in NVLink domains; holds now, ending or starting later, spot) with the
// packer and from scratch, and compares every choice.
func TestPackerChoosesAsFromScratch(t *testing.T) {
	// Not parallel: rapid reads -rapid.checks, which the property tests beside it set
	// (rapidCheck).
	now := time.Date(2030, 3, 4, 10, 0, 0, 0, time.UTC)
	at := func(t *rapid.T, label string, ends bool) *time.Time {
		choices := []time.Duration{-time.Hour, 0, 30 * time.Minute, 2 * time.Hour}
		if ends {
			choices = []time.Duration{-1, time.Minute, time.Hour, 3 * time.Hour} // -1: never
		}
		d := rapid.SampledFrom(choices).Draw(t, label)
		if d == -1 {
			return nil
		}
		v := now.Add(d)
		return &v
	}
	rapid.Check(t, func(rt *rapid.T) {
		var snaps []NodeSnapshot
		for i := range rapid.IntRange(1, 6).Draw(rt, "nodes") {
			s := NodeSnapshot{NodeID: fmt.Sprintf("n%d", i)}
			gpus, domains := rapid.IntRange(1, 8).Draw(rt, "gpus"), rapid.IntRange(1, 2).Draw(rt, "domains")
			for g := range gpus {
				s.GPUs = append(s.GPUs, GPUState{Index: g, UUID: fmt.Sprintf("%d-%d", i, g), Domain: fmt.Sprintf("nv%d", g*domains/gpus),
					Model:   rapid.SampledFrom([]string{"h100", "h100", "a100"}).Draw(rt, "model"),
					Mode:    rapid.SampledFrom([]string{api.GPUModeWhole, api.GPUModeWhole, api.GPUModeWhole, api.GPUModeMIG}).Draw(rt, "mode"),
					Healthy: rapid.IntRange(0, 5).Draw(rt, "healthy") > 0})
			}
			for k := range rapid.IntRange(0, 6).Draw(rt, "holds") {
				g := rapid.IntRange(0, gpus-1).Draw(rt, "gpu")
				from := at(rt, "from", false)
				to := at(rt, "to", true)
				if to != nil && !to.After(*from) {
					continue
				}
				s.Held = append(s.Held, Held{Resource: "gpu", Span: GPUSpan(g), Spot: rapid.Bool().Draw(rt, "spot"),
					Reservation: fmt.Sprintf("r%d-%d", i, k), From: *from, To: to})
			}
			snaps = append(snaps, s)
		}
		ref := make([]NodeSnapshot, len(snaps))
		for i, s := range snaps {
			ref[i] = s
			ref[i].Held = append([]Held(nil), s.Held...)
		}
		pk := newPacker(snaps, now)
		for c := range rapid.IntRange(1, 12).Draw(rt, "calls") {
			shape := api.Shape{GPUs: rapid.IntRange(1, 4).Draw(rt, "want"), NVLink: rapid.Bool().Draw(rt, "nvlink"),
				Model: rapid.SampledFrom([]string{"h100", ""}).Draw(rt, "of")}
			w := window{start: now, end: at(rt, "end", true)}
			wj, wplan, wok := fromScratch(ref, shape, w)
			gj, gplan, gok := pk.place(shape, w)
			if gj != wj || gok != wok || !cmp.Equal(gplan, wplan) {
				rt.Fatalf("call %d (%+v until %v): the packer chose node %d %+v %v; from scratch, node %d %+v %v", c, shape, w.end, gj, gplan, gok, wj, wplan, wok)
			}
			if !wok {
				continue
			}
			pk.take(gj, gplan.Picks, w)
			for _, p := range wplan.Picks {
				ref[wj].Held = append(ref[wj].Held, Held{Resource: p.Resource, Span: p.Span, From: w.start, To: w.end})
			}
		}
	})
}

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
