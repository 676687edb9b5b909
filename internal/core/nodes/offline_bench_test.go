package nodes_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/nodes"
)

// BenchmarkMarkOffline10k: 10,000 online nodes of 8 GPUs whose sessions are all past their
// grace, taken offline by the worker's one transaction (a fleet whose network fell away at once).
//
//	go test ./internal/core/nodes -run '^$' -bench MarkOffline -benchtime 3x
func BenchmarkMarkOffline10k(b *testing.B) {
	env := computetest.New(b, computetest.Options{})
	ctx := context.Background()
	db := env.DB.Pool
	const n = 10_000
	setup := []string{
		`INSERT INTO compute.pools (id, tenant_id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'root', 'bench')`,
		`INSERT INTO compute.nodes (id, tenant_id, pool_id, name, status, health)
		  SELECT ('00000000-0000-0000-0001-' || lpad(to_hex(i), 12, '0'))::uuid, 'root', '00000000-0000-0000-0000-000000000001', 'n' || i, 'online', 'healthy'
		  FROM generate_series(1, $1) i`,
		`INSERT INTO compute.devices (id, node_id, index, uuid, name, model, memory_mib)
		  SELECT gen_random_uuid(), n.id, g, 'GPU-' || n.name || '-' || g, 'NVIDIA H100', 'h100', 81920 FROM compute.nodes n, generate_series(0, 7) g`,
		`SELECT compute.refresh_node_capacity(ARRAY(SELECT id FROM compute.nodes))`,
		`INSERT INTO compute.node_sessions (node_id, gateway_id, epoch, connected_at, last_seen_at, offline_after)
		  SELECT id, 'gw', 1, now(), now(), now() - interval '1 second' FROM compute.nodes`,
		`ANALYZE`,
	}
	for _, q := range setup {
		var args []any
		if q == setup[1] {
			args = []any{n}
		}
		if _, err := db.Exec(ctx, q, args...); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	for b.Loop() {
		b.StopTimer()
		if _, err := db.Exec(ctx, `UPDATE compute.nodes SET status = 'online'`); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		got, err := nodes.MarkOffline(ctx, env.DB)
		if err != nil {
			b.Fatal(err)
		}
		if got != n {
			b.Fatalf("%d nodes taken offline, want %d", got, n)
		}
	}
}
