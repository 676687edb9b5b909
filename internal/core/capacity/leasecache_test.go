package capacity

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
)

// rollupModel is the model the rollup names for a node: that of its whole, healthy GPUs, mixed
// when they are of several, "" when it has none.
func rollupModel(s NodeSnapshot) string {
	model := ""
	for _, g := range s.GPUs {
		if g.Mode != api.GPUModeWhole || !g.Healthy {
			continue
		}
		if model != "" && model != g.Model {
			return "mixed"
		}
		model = g.Model
	}
	return model
}

// TestMemoryPlacesAsThePlannerFromScratch: a pool cache places a sequence of calls on random nodes
// (GPUs of two models, in other modes, unhealthy, in NVLink domains; holds now, ending or starting
// later, spot; nodes not schedulable) exactly as the planner from scratch does over every node the
// candidate query would return, with the clock moving between calls.
func TestMemoryPlacesAsThePlannerFromScratch(t *testing.T) {
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
		var ln loaded
		ln.now = now
		schedulable := map[string]bool{}
		for i := range rapid.IntRange(1, 8).Draw(rt, "nodes") {
			s := NodeSnapshot{NodeID: fmt.Sprintf("n%02d", (i*7)%11)} // ids not in insertion order
			gpus, domains := rapid.IntRange(1, 8).Draw(rt, "gpus"), rapid.IntRange(1, 2).Draw(rt, "domains")
			for g := range gpus {
				s.GPUs = append(s.GPUs, GPUState{Index: g, UUID: fmt.Sprintf("%d-%d", i, g), Domain: fmt.Sprintf("nv%d", g*domains/gpus),
					Model:   rapid.SampledFrom([]string{"h100", "h100", "h100", "a100"}).Draw(rt, "model"),
					Mode:    rapid.SampledFrom([]string{api.GPUModeWhole, api.GPUModeWhole, api.GPUModeWhole, api.GPUModeMIG}).Draw(rt, "mode"),
					Healthy: rapid.IntRange(0, 5).Draw(rt, "healthy") > 0})
			}
			for k := range rapid.IntRange(0, 6).Draw(rt, "holds") {
				g := rapid.IntRange(0, gpus-1).Draw(rt, "gpu")
				from := at(rt, "from", false)
				to := at(rt, "to", true)
				if (to != nil && !to.After(*from)) || (to != nil && !to.After(now)) {
					continue // a load reads only holds that have not ended
				}
				s.Held = append(s.Held, Held{Resource: "gpu", Span: GPUSpan(g), Spot: rapid.Bool().Draw(rt, "spot"),
					Reservation: fmt.Sprintf("r%d-%d", i, k), From: *from, To: to})
			}
			sched := rapid.IntRange(0, 6).Draw(rt, "schedulable") > 0
			schedulable[s.NodeID] = sched
			ln.nodes = append(ln.nodes, loadedNode{id: s.NodeID, model: rollupModel(s), schedulable: sched, changed: 1,
				gpus: s.GPUs, held: slices.Clone(s.Held)})
		}
		c := newPoolCache("pool", 1)
		c.install(ln, nil, 0)
		// The reference: every node, in id order, as snapshots the calls' bookings are added to.
		var ref []NodeSnapshot
		for _, n := range ln.nodes {
			ref = append(ref, NodeSnapshot{NodeID: n.id, GPUs: n.gpus, Held: slices.Clone(n.held)})
		}
		slices.SortFunc(ref, func(a, b NodeSnapshot) int { return cmpString(a.NodeID, b.NodeID) })
		clock := now
		for k := range rapid.IntRange(1, 12).Draw(rt, "calls") {
			clock = clock.Add(rapid.SampledFrom([]time.Duration{0, 0, time.Minute, 31 * time.Minute}).Draw(rt, "tick"))
			shape := api.Shape{GPUs: rapid.IntRange(1, 4).Draw(rt, "want"), NVLink: rapid.Bool().Draw(rt, "nvlink"),
				Model: rapid.SampledFrom([]string{"h100", ""}).Draw(rt, "of")}
			w := window{start: clock}
			if d := rapid.SampledFrom([]time.Duration{0, time.Minute, time.Hour}).Draw(rt, "length"); d > 0 {
				end := clock.Add(d)
				w.end = &end
			}
			var cands []NodeSnapshot
			for _, s := range ref {
				if schedulable[s.NodeID] && (shape.Model == "" || rollupModel(s) == shape.Model) {
					cands = append(cands, s)
				}
			}
			wj, wplan, wok := fromScratch(cands, shape, w)
			gn, gplan, gok := c.place(shape, w, uint64(100+k))
			want, got := "", ""
			if wok {
				want = cands[wj].NodeID
			}
			if gok {
				got = gn.snap.NodeID
			}
			if got != want || gok != wok || (wok && !cmp.Equal(gplan, wplan)) {
				rt.Fatalf("call %d (%+v from %s until %v): memory chose %q %+v; from scratch, %q %+v", k, shape, clock, w.end, got, gplan, want, wplan)
			}
			if !wok {
				continue
			}
			c.take(gn, gplan.Picks, w, uint64(100+k))
			c.sent(uint64(100 + k))
			for i := range ref {
				if ref[i].NodeID == want {
					for _, p := range wplan.Picks {
						ref[i].Held = append(ref[i].Held, Held{Resource: p.Resource, Span: p.Span, From: w.start, To: w.end})
					}
				}
			}
		}
	})
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestMemoryForgetsAndKeepsItsOwnWrites: a write refused is dropped from memory; one that committed
// stays after a reload that saw it, without counting twice; one still in flight survives a
// reload that could not see it; a node whose rollup another writer changed is taken out of
// placement until it is read again.
func TestMemoryForgetsAndKeepsItsOwnWrites(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 3, 4, 10, 0, 0, 0, time.UTC)
	gpus := func() []GPUState {
		var out []GPUState
		for g := range 4 {
			out = append(out, GPUState{Index: g, UUID: fmt.Sprint(g), Model: "h100", Mode: api.GPUModeWhole, Healthy: true})
		}
		return out
	}
	c := newPoolCache("pool", 1)
	c.install(loaded{now: now, xmin: 10, nodes: []loadedNode{{id: "a", model: "h100", schedulable: true, changed: 5, gpus: gpus()}}}, nil, 0)
	one := api.Shape{GPUs: 1, Model: "h100"}
	w := window{start: now}
	place := func(xid uint64) int {
		t.Helper()
		n, plan, ok := c.place(one, w, xid)
		if !ok {
			t.Fatal("no room in memory")
		}
		c.take(n, plan.Picks, w, xid)
		c.sent(xid)
		return plan.Picks[0].Span.Lo / PositionsPerGPU
	}
	if g := place(20); g != 0 {
		t.Fatalf("first placement on GPU %d, want 0", g)
	}
	c.drop(20, now) // refused
	if g := place(21); g != 0 {
		t.Fatalf("after the refused write, GPU %d, want 0 again", g)
	}
	place(22) // GPU 1, in flight while the node is read again
	// A reload that saw 21 committed and not 22: GPU 0 from the database, GPU 1 still ours.
	n := c.nodes["a"]
	c.install(loaded{now: now, visible: map[uint64]bool{21: true}, nodes: []loadedNode{{id: "a", model: "h100", schedulable: true, changed: 21, gpus: gpus(),
		held: []Held{{Resource: "gpu", Span: GPUSpan(0), From: now}}}}}, []string{"a"}, c.seq)
	if len(n.snap.Held) != 2 || n.free != 2 {
		t.Fatalf("after the reload: holds %+v, free %d; want GPU 0 (database) and GPU 1 (in flight), 2 free", n.snap.Held, n.free)
	}
	// The delta shows our own write: nothing to read again. Another writer's: out of placement.
	c.applyDelta(30, []string{"a"}, []uint64{22})
	if n.stale != 0 {
		t.Fatal("our own write made the node stale")
	}
	c.applyDelta(31, []string{"a"}, []uint64{40})
	if n.stale == 0 || len(c.staleNodes()) != 1 {
		t.Fatal("another writer's change did not make the node stale")
	}
	if _, _, ok := c.place(one, w, 99); ok {
		t.Fatal("placed on a stale node")
	}
	if c.since != 31 {
		t.Fatalf("since = %d, want 31", c.since)
	}
	c.committed(22)
	if slices.Contains(n.tags, 22) {
		t.Fatal("a committed write's holds are still tagged")
	}
}
