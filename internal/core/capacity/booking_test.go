package capacity_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres"
)

// TestConstraintRefusesDoubleBookingInSQL bypasses every line of Go: plain INSERTs, and the
// database alone refuses what the hardware would refuse.
func TestConstraintRefusesDoubleBookingInSQL(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 1, gpus: 2})
	node := f.nodes[0].ID
	ctx := context.Background()
	if _, err := f.DB.Pool.Exec(ctx, `INSERT INTO compute.reservations (id, tenant_id, pool_id, state, shape, members, starts_at, created_by)
		VALUES ('00000000-0000-7000-8000-000000000001', 'root', $1, 'active', '{}', 1, now(), 'test')`, f.pool.ID); err != nil {
		t.Fatal(err)
	}
	insert := func(lo, hi int, from, to string) error {
		tx, err := f.DB.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, units, atoms, during)
			VALUES ('00000000-0000-7000-8000-000000000001', 0, $1, 'gpu', 'gpu', 1, int4range($2, $3), tstzrange($4::timestamptz, $5::timestamptz))`,
			node, lo, hi, from, to)
		if err == nil {
			return tx.Commit(ctx)
		}
		return err
	}
	const a, b, c = "2030-01-01 00:00Z", "2030-01-01 01:00Z", "2030-01-01 02:00Z"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		if postgres.ErrorCode(err) != postgres.ExclusionViolation {
			t.Errorf("%s: %v, want an exclusion violation (23P01)", what, err)
		}
	}
	// GPU 0 held whole from a to b.
	must(insert(0, 64, a, b))
	refused("a MIG slice of the held GPU", insert(8, 16, a, b))
	refused("a time-slice share of the held GPU", insert(0, 1, a, b))
	refused("the whole GPU again, overlapping in time", insert(0, 64, "2030-01-01 00:30Z", c))
	must(insert(0, 64, b, c)) // back to back: [a, b) and [b, c) do not overlap
	// GPU 1 in MIG: 3g.40gb at slice 0 and 3g.40gb at slice 4 fit side by side.
	must(insert(64, 96, a, b))
	must(insert(96, 128, a, b))
	refused("a 2g.20gb at slice 2, inside the first 3g.40gb", insert(64+16, 64+32, a, b))
	// Time-slice shares: distinct shares coexist; one share cannot be held twice.
	must(insert(64, 65, b, c))
	must(insert(65, 66, b, c))
	refused("share 1 twice", insert(65, 66, b, c))
	refused("the whole GPU 1 while shares are held", insert(64, 128, b, c))

	n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id AND a.node_id = b.node_id
		AND a.resource = b.resource AND a.atoms && b.atoms AND a.during && b.during`)
	if n != 0 {
		t.Fatalf("%d pairs of bookings overlap", n)
	}
	_ = fmt.Sprint
}
