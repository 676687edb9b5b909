package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
)

// fleetSQL writes a fleet of n nodes of 8 H100s each straight into the database, faster than any
// join: a node in 53 offline, one in 97 cordoned, one in 211 draining; about one GPU in 200
// unhealthy and one in 100 degraded. Of every five nodes two are held whole, one half, and one in
// ten has two GPUs held by spot.
const fleetSQL = `
WITH n AS (
  INSERT INTO compute.nodes (id, tenant_id, pool_id, name, state, status, health, last_seen_at)
  SELECT gen_random_uuid(), 'root', $1, format('node-%s', lpad(i::text, 5, '0')),
    CASE WHEN i % 97 = 0 THEN 'cordoned' WHEN i % 211 = 0 THEN 'draining' ELSE 'active' END,
    CASE WHEN i % 53 = 0 THEN 'offline' ELSE 'online' END, 'healthy', compute.compute_now()
  FROM generate_series(1, $2::int) i
  RETURNING id, name)
INSERT INTO compute.devices (id, node_id, index, uuid, name, model, memory_mib, health)
SELECT gen_random_uuid(), n.id, g, 'GPU-' || n.name || '-' || g, 'NVIDIA H100 80GB HBM3', 'h100', 81559,
  CASE WHEN random() < 0.005 THEN 'unhealthy' WHEN random() < 0.01 THEN 'degraded' ELSE 'healthy' END
FROM n, generate_series(0, 7) g`

const holdersSQL = `
WITH plan AS MATERIALIZED (
  SELECT gen_random_uuid() AS res, id AS node,
    CASE WHEN k % 10 < 4 THEN 8 WHEN k % 10 < 6 THEN 4 ELSE 2 END AS gpus, k % 10 = 6 AS spot
  FROM (SELECT id, row_number() OVER (ORDER BY name) AS k FROM compute.nodes WHERE pool_id = $1) x
  WHERE k % 10 < 7),
r AS (
  INSERT INTO compute.reservations (id, tenant_id, pool_id, state, spot, shape, members, starts_at, created_by)
  SELECT res, 'root', $1, 'active', spot, jsonb_build_object('gpus', gpus), 1, compute.compute_now() - interval '1 hour', 'fleet10k'
  FROM plan)
INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, atoms, during, spot, model, units)
SELECT res, 0, node, 'gpu', 'gpu', int4range(0, gpus * 64), tstzrange(compute.compute_now() - interval '1 hour', NULL), spot, 'h100', gpus
FROM plan`

// TestFleetMapOf10000Nodes measures the fleet map with 10,000 nodes and 80,000 GPUs: the reads
// of devices.map (two pages of 5,000 nodes, from Go and from the page) and the time from the
// data in the page's memory to the map drawn, and painted. It prints; it asserts only that
// every node is drawn. Run it with -v to see the figures (docs/console.md reports them).
func TestFleetMapOf10000Nodes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("writes 10,000 nodes and starts a browser")
	}
	const nodes = 10_000
	b := newBrowser(t, 1400, 1000)
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	pool, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100", Description: "10,000 nodes written by the test"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := env.DB.Pool.Exec(ctx, fleetSQL, pool.ID, nodes); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Pool.Exec(ctx, holdersSQL, pool.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d nodes, %d GPUs and their holders in %s", nodes, nodes*8, time.Since(start).Round(time.Millisecond))
	url := env.Server(t)

	// The API's side: the map in pages of 5,000 nodes, as the console reads it.
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	for pass := range 2 { // the first read warms the caches, and weighs the answers
		start = time.Now()
		read, pages, size, cursor := 0, 0, 0, ""
		for {
			page, err := cl.Devices.Map(ctx, api.MapDevices{Limit: api.MaxMapLimit, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			read += len(page.Items)
			pages++
			if pass == 0 {
				b, _ := json.Marshal(page)
				size += len(b)
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		if read != nodes {
			t.Fatalf("devices.map read %d nodes, want %d", read, nodes)
		}
		if pass == 0 {
			t.Logf("devices.map from Go, cold: %d nodes in %d pages, %.1f MB of JSON, %s", read, pages, float64(size)/1e6, time.Since(start).Round(time.Millisecond))
		} else {
			t.Logf("devices.map from Go, warm: %s", time.Since(start).Round(time.Millisecond))
		}
	}

	// The page's side.
	b.run("sign in", chromedp.Navigate(url+"/console/config.json"),
		void(chromedp.Evaluate[any](fmt.Sprintf(`sessionStorage.setItem('bc.credential', %q); sessionStorage.setItem('bc.how', 'key')`, env.RootKey))),
		chromedp.Navigate(url+"/console/#/fleet"))
	type timing struct{ Nodes, FetchMs, LayoutMs, DrawMs, PaintedMs float64 }
	var runs []timing
	for i := range 5 {
		if i > 0 {
			b.run("refresh", chromedp.Click(chromedp.CSS("#fleet-refresh")))
		}
		b.run("the map is drawn", void(chromedp.Poll[any](`document.getElementById('fleet-timing')?.dataset.ready === 'true'`,
			chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(20*time.Millisecond))))
		tm := eval[timing](b, `window.bcConsole.fleetTiming`)
		if tm.Nodes != nodes {
			t.Fatalf("the map drew %v nodes, want %d", tm.Nodes, nodes)
		}
		t.Logf("run %d: read %.0f ms, layout %.1f ms, draw %.1f ms, to the screen %.0f ms", i+1, tm.FetchMs, tm.LayoutMs, tm.DrawMs, tm.PaintedMs)
		runs = append(runs, tm)
	}
	median := func(f func(timing) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	t.Logf("fleet map, %d nodes, %d GPUs, median of %d: read (devices.map, 2 pages) %.0f ms; layout and draw %.0f ms; data to screen %.0f ms",
		nodes, nodes*8, len(runs), median(func(r timing) float64 { return r.FetchMs }),
		median(func(r timing) float64 { return r.LayoutMs + r.DrawMs }), median(func(r timing) float64 { return r.PaintedMs }))
	if got := b.text("#fleet-summary"); got == "" {
		t.Error("no summary")
	} else {
		t.Log(got)
	}
	b.shot("fleet-10k")

	// The node list holds 10,000 rows of which only those in view are in the document.
	b.run("the nodes", view("nodes"), waitJS(`document.querySelector('.vtable[aria-rowcount="10001"] .vspacer .vrow') !== null`))
	if rows := eval[int](b, `document.querySelectorAll('.vtable .vspacer .vrow').length`); rows > 100 {
		t.Errorf("the node list has %d rows in the document, want only those in view", rows)
	} else {
		t.Logf("the node list: 10,000 rows, %d in the document", rows)
	}
}
