package compute_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestBillingDoesNotMoveDesiredState pins a waste: every billing update of a booking
// (billed_until) bumped its node's desired-state generation and woke its gateway to push an
// unchanged state. Only a change to what the booking holds (its window, atoms or node) may.
func TestBillingDoesNotMoveDesiredState(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env, ctx := ff.env, context.Background()
	if _, err := env.Compute.API.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 1}, Duration: "2h"}); err != nil {
		t.Fatal(err)
	}
	gen := func() int {
		return computetest.Count(t, env.DB.Pool, `SELECT generation FROM compute.node_desired WHERE node_id = $1`, ff.nodeID)
	}
	before := gen()
	if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.bookings SET billed_until = lower(during)`); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g != before {
		t.Fatalf("a billing update moved the desired generation %d → %d", before, g)
	}
	if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.bookings SET during = tstzrange(lower(during), upper(during) - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	if g := gen(); g != before+1 {
		t.Fatalf("a booking's new window moved the generation %d → %d, want %d", before, g, before+1)
	}
}
