package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// rollupFleet is a pool of nodes of 8 GPUs each, put online through fleet's writes alone.
type rollupFleet struct {
	*computetest.Env
	ctx   context.Context
	nodes []string
}

func newRollupFleet(t *testing.T, n int) *rollupFleet {
	t.Helper()
	f := &rollupFleet{Env: computetest.New(t, computetest.Options{}), ctx: context.Background()}
	pool, err := f.Compute.API.Pools.Create(f.ctx, f.RootKey, api.CreatePool{Name: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		node, err := fleet.InsertNode(f.ctx, f.DB.Pool, fleet.NewNode{PoolID: pool.ID, Name: fmt.Sprintf("node-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		inv := capacity.Inventory{VCPUs: 16, MemoryGiB: 64}
		for g := range 8 {
			inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("GPU-%d-%d", i, g), Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559})
		}
		if err := capacity.SetInventory(f.ctx, f.DB.Pool, node.ID, inv); err != nil {
			t.Fatal(err)
		}
		f.nodes = append(f.nodes, node.ID)
	}
	f.write(t, func(tx pgx.Tx) error { return fleet.Connect(f.ctx, tx, f.nodes) })
	return f
}

// write runs one of fleet's writes in a transaction that locks the nodes first, as its callers do.
func (f *rollupFleet) write(t *testing.T, w func(pgx.Tx) error) {
	t.Helper()
	if err := f.DB.Tx(f.ctx, func(tx pgx.Tx) error {
		if err := fleet.LockNodes(f.ctx, tx, f.nodes); err != nil {
			return err
		}
		return w(tx)
	}); err != nil {
		t.Fatal(err)
	}
}

// rollups is what the rollups say of each node, in the order of f.nodes: whether it schedules,
// and how many GPUs it has free.
func (f *rollupFleet) rollups(t *testing.T) (schedulable string, free []int) {
	t.Helper()
	var flags []string
	for _, id := range f.nodes {
		var s bool
		var n int
		if err := f.DB.Pool.QueryRow(f.ctx, `SELECT schedulable, gpus_free FROM compute.node_capacity WHERE node_id = $1`, id).Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		flags, free = append(flags, fmt.Sprint(s)), append(free, n)
	}
	return strings.Join(flags, " "), free
}

func (f *rollupFleet) noDrift(t *testing.T) {
	t.Helper()
	drift, err := capacity.Drift(f.ctx, f.DB.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) > 0 {
		t.Fatalf("the rollups drifted: %v", drift)
	}
}

// TestNodeWritesKeepRollups: a change of a node's status, health or state through fleet's writes
// alone, with no call of capacity.RefreshNodes, leaves every rollup exact, its schedulable flag
// included (which Drift does not compare): the trigger on compute.nodes recounts them.
func TestNodeWritesKeepRollups(t *testing.T) {
	t.Parallel()
	f := newRollupFleet(t, 3)
	if got, free := f.rollups(t); got != "true true true" || !slices.Equal(free, []int{8, 8, 8}) {
		t.Fatalf("after the nodes connected the rollups say schedulable %s, free %v", got, free)
	}
	if _, err := f.Compute.API.Reservations.Create(f.ctx, f.RootKey, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 8}}); err != nil {
		t.Fatal(err)
	}
	one, two := f.nodes[:1], f.nodes[:2]
	steps := []struct {
		name  string
		write func(pgx.Tx) error
		want  string
	}{
		{"two nodes offline", func(tx pgx.Tx) error { _, err := fleet.SetStatus(f.ctx, tx, two, api.NodeOffline); return err }, "false false true"},
		{"back online", func(tx pgx.Tx) error { _, err := fleet.SetStatus(f.ctx, tx, two, api.NodeOnline); return err }, "true true true"},
		{"unhealthy", func(tx pgx.Tx) error { return fleet.SetHealth(f.ctx, tx, one, api.HealthUnhealthy) }, "false true true"},
		{"degraded still schedules", func(tx pgx.Tx) error { return fleet.SetHealth(f.ctx, tx, one, api.HealthDegraded) }, "true true true"},
		{"cordoned", func(tx pgx.Tx) error { return fleet.SetState(f.ctx, tx, f.nodes, api.NodeCordoned) }, "false false false"},
		{"active again", func(tx pgx.Tx) error { return fleet.SetState(f.ctx, tx, f.nodes, api.NodeActive) }, "true true true"},
		// Writes the rollup does not count leave it alone and need no recount.
		{"seen", func(tx pgx.Tx) error {
			return fleet.MarkSeen(f.ctx, tx, []fleet.Seen{{Node: f.nodes[0], At: time.Now()}, {Node: f.nodes[2], At: time.Now()}})
		}, "true true true"},
	}
	for _, s := range steps {
		f.write(t, s.write)
		got, free := f.rollups(t)
		// One node's 8 GPUs are booked, whichever node it is.
		slices.Sort(free)
		if got != s.want || !slices.Equal(free, []int{0, 8, 8}) {
			t.Fatalf("%s: the rollups say schedulable %s, free %v; want %s, [0 8 8]", s.name, got, free, s.want)
		}
		f.noDrift(t)
	}
}

// TestNodeWriteCountsAfterItsWait: a node's write that waits for its rollup's lock (held here,
// as the worker's tick holds it while it ends a booking) recounts as of when it has the lock, not
// as of its statement's start: a recount as of the start would count the booking that ended
// meanwhile as held, and no later change would correct it.
func TestNodeWriteCountsAfterItsWait(t *testing.T) {
	t.Parallel()
	f := newRollupFleet(t, 1)
	f.DB.ResetNow()
	r, err := f.Compute.API.Reservations.Create(f.ctx, f.RootKey, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 1}, Duration: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(time.Second)
	if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.bookings SET during = tstzrange(lower(during), $2) WHERE reservation_id = $1`, r.ID, end); err != nil {
		t.Fatal(err)
	}
	holder, err := f.DB.Pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(f.ctx)
	if _, err := holder.Exec(f.ctx, `SELECT 1 FROM compute.node_capacity WHERE node_id = $1 FOR UPDATE`, f.nodes[0]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fleet.SetHealth(f.ctx, f.DB.Pool, f.nodes, api.HealthDegraded) }()
	computetest.Eventually(t, 30*time.Second, "the write waiting on the rollup's lock", func() bool {
		return computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	// The booking ends on the database's clock while the write waits: what is under test.
	computetest.Eventually(t, 10*time.Second, "the database's clock past the booking's end", func() bool {
		var past bool
		if err := f.DB.Pool.QueryRow(f.ctx, `SELECT pg_catalog.clock_timestamp() >= $1`, end).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	select {
	case err := <-done:
		t.Fatalf("the write did not wait for the rollup's lock: %v", err)
	default:
	}
	if err := holder.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, free := f.rollups(t); got != "true" || free[0] != 8 {
		t.Fatalf("after the booking ended the rollup says schedulable %s, free %v; want true, [8]", got, free)
	}
	f.noDrift(t)
}
