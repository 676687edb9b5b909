package capacity_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres"
)

// TestBigFlushAfterASmallOne: the rollup trigger on compute.nodes compares a statement's old and
// new rows. PL/pgSQL keeps a statement's plan per connection from its first call, and a plan made
// for a one-row heartbeat flush (a nested loop) took 9.3 s for a 10,000-row one at 10k nodes,
// against 70 ms when planned for its size: the gateway's flushes fell behind and live nodes were
// marked offline. A 10,000-row flush on a connection that has flushed one row first must take
// about as long as on a fresh connection, whose first plan is made for 10,000 rows.
func TestBigFlushAfterASmallOne(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{})
	ctx := context.Background()
	const n = 10000
	ids := flushNodes(t, f, n)
	// flush marks nodes seen on a connection of its own, small flushes first; it returns how
	// long the last, the big one, took.
	flush := func(small int) time.Duration {
		conn, err := f.DB.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		q := postgres.Querier(conn)
		for i := range small {
			if err := fleet.MarkSeen(ctx, q, seen(ids[i:i+1])); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if err := fleet.MarkSeen(ctx, q, seen(ids)); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	f.DB.Pool.Reset() // every connection fresh: no plan made before
	fresh := flush(0)
	f.DB.Pool.Reset()
	after := flush(6) // past PL/pgSQL's five custom plans, to a generic one if it would
	t.Logf("a %d-row flush: %s on a fresh connection, %s after one-row flushes", n, fresh, after)
	if after > 5*fresh+time.Second {
		t.Errorf("a %d-row flush took %s after one-row flushes, %s on a fresh connection: a plan made for one row was reused", n, after, fresh)
	}
}

// flushNodes adds n online nodes to f's pool in one statement and returns their ids.
func flushNodes(t testing.TB, f *testFleet, n int) []string {
	t.Helper()
	rows, err := f.DB.Pool.Query(f.ctx, `INSERT INTO compute.nodes (id, tenant_id, pool_id, name, status, health)
		SELECT gen_random_uuid(), p.tenant_id, p.id, 'flush-' || i, 'online', 'healthy'
		FROM compute.pools p, generate_series(1, $2) i WHERE p.id = $1 RETURNING id::text`, f.pool.ID, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) != n {
		t.Fatalf("%d nodes, %v", len(ids), err)
	}
	return ids
}

// seen is a heartbeat flush of ids.
func seen(ids []string) []fleet.Seen {
	out := make([]fleet.Seen, len(ids))
	for i, id := range ids {
		out[i] = fleet.Seen{Node: id, At: t0.Add(time.Minute)}
	}
	return out
}

// BenchmarkHeartbeatFlush: a gateway's heartbeat flush (fleet.MarkSeen) of 10,000 nodes, on a
// connection that flushed one node first, as a gateway's does; ms/flush is the figure
// docs/benchmarks.md records (target < 200 ms).
func BenchmarkHeartbeatFlush(b *testing.B) {
	f := newFleet(b, fleetSpec{})
	ids := flushNodes(b, f, 10000)
	conn, err := f.DB.Pool.Acquire(f.ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if err := fleet.MarkSeen(f.ctx, conn, seen(ids[:1])); err != nil {
		b.Fatal(err)
	}
	all := seen(ids)
	for b.Loop() {
		if err := fleet.MarkSeen(f.ctx, conn, all); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed())/float64(time.Millisecond)/float64(b.N), "ms/flush")
}
