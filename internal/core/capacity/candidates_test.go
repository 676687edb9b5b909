package capacity_test

import (
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
)

// TestCandidateWalkSkipsFullNodes: the best-fit walk starts at the nodes with enough free GPUs,
// an index condition, so the full nodes (the fewest free, first in the index's order) are never
// read one by one, however many there are.
func TestCandidateWalkSkipsFullNodes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 6, gpus: 2})
	for range 8 { // 4 of the 6 nodes full
		f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}})
	}
	tx, err := f.DB.Pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	// On six rows the planner would rather read them all; what is tested is that the index can
	// bound the walk.
	if _, err := tx.Exec(f.ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
		t.Fatal(err)
	}
	plan, err := capacity.ExplainCandidates(f.ctx, tx, f.pool.ID, "h100", 1)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "gpus_free >= ") || strings.Contains(text, "Rows Removed by Filter") {
		t.Fatalf("the walk does not start at the nodes with a free GPU:\n%s", text)
	}
}

// TestSpotPassFindsSpotHeldNode: when no node has the GPUs free, a normal request walks the nodes
// with spot holders and preempts them.
func TestSpotPassFindsSpotHeldNode(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 3, gpus: 2})
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2, Model: "h100"}})
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}})
	spot := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}, Spot: true})
	f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 2, Model: "h100"}, Spot: true})
	// Every node is now full; the first two spot-held GPUs on one node, its other GPU normal.
	r := f.mustReserve(t, api.CreateReservation{Shape: api.Shape{GPUs: 1, Model: "h100"}})
	if len(r.Allocations) != 1 {
		t.Fatalf("allocations %+v", r.Allocations)
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.reservations WHERE state = 'preempted'`); n != 1 {
		t.Fatalf("%d reservations preempted, want 1 (a spot one, e.g. %s)", n, spot.ID)
	}
}
