// Command placebench measures placements: reservations of one whole GPU, "now", through the
// in-process API (authentication, the IAM decision, the placer's transaction), on a pool of
// -nodes nodes × 8 GPUs at 0%, 50% and 90% utilisation, with 1, 8 and 32 concurrent clients. In
// the same run it measures the physical limit placements compete with: single-row inserts into a
// bare EXCLUDE-guarded table on the same database, with the same clients. It prints a Markdown
// table. -live books that many more one-GPU bookings first, filling whole nodes (8 a node), so that
// placements/s can be compared from 0 to tens of thousands of live bookings.
//
// -lease names the placers measured, in turn for each row: "on", a control plane in the api mode
// that holds the pool's lease and places from memory (a fresh one per row, started after the fill,
// so that it loads the pool as it stands), and "off", one that places through the database. With
// -repeat N each row is measured N times, the placers' order alternating, so that the machine's
// drift falls on both.
//
//	go run ./internal/tools/cmd/placebench [-nodes 1000] [-n 1000] [-live 0] [-lease on,off] [-repeat 1]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/embedded"
)

func main() {
	nodes := flag.Int("nodes", 1000, "nodes in the pool (8 GPUs each)")
	n := flag.Int("n", 1000, "placements per measurement (at most half the free GPUs)")
	clientsFlag := flag.String("clients", "1,8,32", "client counts")
	liveFlag := flag.String("live", "0", "live one-GPU bookings besides the utilisation's, 8 a node on the first nodes (a list: each is measured)")
	explain := flag.Bool("explain", false, "print EXPLAIN ANALYZE of the best-fit candidate query before each row")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the measurements (not the set-up) to this file")
	inflight := flag.Int("inflight", envelope.BatchesInFlight, "batches of one key in flight at once")
	traceFlag := flag.Bool("trace", false, "print where the time of each statement goes, then exit after the first row")
	leaseFlag := flag.String("lease", "on,off", "placers to measure: on (the pool-lease placer, from memory), off (through the database)")
	repeat := flag.Int("repeat", 1, "measurements of each row, the placers' order alternating")
	utilFlag := flag.String("util", "0,50,90", "utilisations, in percent")
	slow = flag.Duration("slow", 0, "print each operation slower than this, with when it started")
	statements := flag.Bool("statements", false, "print, for each row, the statements that took the database's time (pg_stat_statements)")
	flag.Parse()
	envelope.BatchesInFlight = *inflight
	trace = traceFlag
	ctx := context.Background()

	settings := map[string]string{"max_connections": "200", "session_preload_libraries": os.Getenv("PB_PRELOAD"), "auto_explain.log_min_duration": "2ms", "auto_explain.log_analyze": "on"}
	if *statements {
		settings["shared_preload_libraries"] = "pg_stat_statements"
		settings["pg_stat_statements.track"] = "all"
	}
	cluster, err := embedded.Start(ctx, embedded.Options{DataDir: os.Getenv("PB_DIR"), Settings: settings})
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Stop(ctx)
	cfg, _ := pgxpool.ParseConfig(cluster.URL("postgres"))
	cfg.MaxConns = 64
	if *trace {
		cfg.ConnConfig.Tracer = tracer
	}
	db, err := postgres.OpenConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	port, _ := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"})
	// newCompute is a control plane on the database: lease on (api mode; Start it) or off.
	newCompute := func(lease bool) *compute.Compute {
		o := compute.Options{Database: db, Secret: "placebench-secret-0123456789abcdef", BaseURL: "http://bench.test",
			RootTenantID: "root", IAM: port, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), PoolLeaseTTL: -1}
		if lease {
			o.Mode, o.PoolLeaseTTL = compute.ModeAPI, 0
		}
		c, err := compute.New(o)
		if err != nil {
			log.Fatal(err)
		}
		if err := c.Initialize(ctx); err != nil {
			log.Fatal(err)
		}
		return c
	}
	c := newCompute(false)
	key, _ := port.CreateAdminKey(ctx, "root", "bench")
	pool, err := c.API.Pools.Create(ctx, key.Token, api.CreatePool{Name: "h100"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "placebench: building %d nodes × 8 GPUs\n", *nodes)
	var ids []string
	for i := range *nodes {
		node, err := fleet.InsertNode(ctx, db.Pool, fleet.NewNode{PoolID: pool.ID, Name: fmt.Sprintf("gpu-%05d", i)})
		if err != nil {
			log.Fatal(err)
		}
		inv := capacity.Inventory{VCPUs: 192, MemoryGiB: 2048}
		for g := range 8 {
			inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("GPU-%05d-%d", i, g), Name: "NVIDIA H100 80GB HBM3",
				MemoryMiB: 81559, NVLinkDomain: fmt.Sprintf("nv-%05d", i)})
		}
		if err := capacity.SetInventory(ctx, db.Pool, node.ID, inv); err != nil {
			log.Fatal(err)
		}
		ids = append(ids, node.ID)
	}
	// As if every node had opened its session: online and healthy.
	if err := db.Tx(ctx, func(tx pgx.Tx) error {
		if err := fleet.LockNodes(ctx, tx, ids); err != nil {
			return err
		}
		return fleet.Connect(ctx, tx, ids)
	}); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA bench; CREATE TABLE bench.raw (
		  node int NOT NULL, resource text NOT NULL, atoms int4range NOT NULL, during tstzrange NOT NULL,
		  EXCLUDE USING gist (node WITH =, resource WITH =, atoms WITH &&, during WITH &&))`); err != nil {
		log.Fatal(err)
	}

	clients := splitInts(*clientsFlag)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	placers := strings.Split(*leaseFlag, ",")
	fmt.Printf("| live | clients | utilisation | placer | placements/s | p50 | p99 | slowest | raw inserts/s | raw p99 | placements ÷ raw |\n")
	fmt.Printf("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, live := range splitInts(*liveFlag) {
		for _, util := range splitInts(*utilFlag) {
			for _, cl := range clients {
				for r := range *repeat {
					order := slices.Clone(placers)
					if r%2 == 1 {
						slices.Reverse(order)
					}
					for _, placer := range order {
						full := min((live+7)/8, len(ids))
						if err := fill(ctx, db, pool.ID, ids[:full], ids[full:], live, util); err != nil {
							log.Fatal(err)
						}
						if *explain {
							explainCandidates(ctx, db, pool.ID)
						}
						pc := c
						var leases *capacity.Leases
						if placer == "on" {
							pc = newCompute(true)
							if err := pc.Start(ctx); err != nil {
								log.Fatal(err)
							}
							leases = pc.Runtime().Capacity.(capacity.Service).Leases
							wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
							start := time.Now()
							if err := leases.Await(wctx, pool.ID); err != nil {
								log.Fatal(err)
							}
							cancel()
							fmt.Fprintf(os.Stderr, "placebench: lease taken, %d nodes loaded in %s\n", len(ids), time.Since(start).Round(time.Millisecond))
						}
						// One placement and its release first, through the control plane measured: a fresh
						// one (lease on) must not pay its first call's caches in the measurement.
						r, err := pc.API.Reservations.Create(ctx, key.Token, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 1, Model: "h100"}})
						if err != nil {
							log.Fatal(err)
						}
						if _, err := pc.API.Reservations.Release(ctx, key.Token, api.ReleaseReservation{Reservation: r.ID}); err != nil {
							log.Fatal(err)
						}
						free := (len(ids) - full) * 8 * (100 - util) / 100
						count := min(*n, free/2)
						if *statements {
							if _, err := db.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()`); err != nil {
								log.Fatal(err)
							}
						}
						rate, p50, p99, slowest, fails := measure(cl, count, func() error {
							_, err := pc.API.Reservations.Create(ctx, key.Token, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 1, Model: "h100"}})
							return err
						})
						if fails > 0 {
							fmt.Fprintf(os.Stderr, "placebench: %d of %d placements failed\n", fails, count)
						}
						if *statements {
							printStatements(ctx, db, count)
						}
						if leases != nil {
							fmt.Fprintf(os.Stderr, "placebench: lease: %+v\n", leases.Stats())
							if err := pc.Stop(ctx); err != nil {
								log.Fatal(err)
							}
						}
						// The raw inserts' first round trips too (each connection's first insert, the table's
						// first pages) are not what is measured: a few first, on rows of their own.
						warm := atomic.Int64{}
						measure(cl, 4*cl, func() error {
							_, err := db.Pool.Exec(ctx, `INSERT INTO bench.raw (node, resource, atoms, during) VALUES ($1, 'gpu', int4range(0, 64), tstzrange(now(), NULL))`, -1-warm.Add(1))
							return err
						})
						var next atomic.Int64
						rawRate, _, rawP99, _, _ := measure(cl, count, func() error {
							i := next.Add(1)
							_, err := db.Pool.Exec(ctx, `INSERT INTO bench.raw (node, resource, atoms, during)
					VALUES ($1, 'gpu', int4range($2, $2 + 64), tstzrange(now(), NULL))`, i%int64(*nodes), (i/int64(*nodes))*64)
							return err
						})
						if _, err := db.Pool.Exec(ctx, `TRUNCATE bench.raw`); err != nil {
							log.Fatal(err)
						}
						fmt.Printf("| %d | %d | %d%% | %s | %.0f | %s | %s | %s | %.0f | %s | %.2f |\n", live, cl, util, placer, rate, ms(p50), ms(p99), ms(slowest), rawRate, ms(rawP99), rate/rawRate)
						if *trace {
							tracer.report(count)
							return
						}
					}
				}
			}
		}
	}
	fmt.Printf("\n%d nodes × 8 GPUs, live one-GPU bookings besides the utilisation's as the first column; %d placements of 1 GPU per row (fewer where free capacity is short); %s, GOMAXPROCS %d; PostgreSQL in the same machine, fsync off.\n",
		*nodes, *n, runtime.GOOS+"/"+runtime.GOARCH, runtime.GOMAXPROCS(0))
}

// fill empties the pool, books live one-GPU bookings on the full nodes (8 a node, one reservation
// a node), then util% of every other node's GPUs with one background reservation per node,
// written directly (the fill is not what is measured).
func fill(ctx context.Context, db *postgres.DB, pool string, full, nodes []string, live, util int) error {
	if _, err := db.Pool.Exec(ctx, `DELETE FROM compute.reservations`); err != nil {
		return err
	}
	if live > 0 {
		_, err := db.Pool.Exec(ctx, `WITH r AS (
			  INSERT INTO compute.reservations (id, tenant_id, pool_id, state, shape, members, starts_at, created_by)
			  SELECT gen_random_uuid(), 'root', $1, 'active', '{}', 1, now() - interval '1 minute', 'fill' FROM unnest($2::uuid[]) n
			  RETURNING id
			), pairs AS (
			  SELECT r.id, n, k FROM (SELECT id, row_number() OVER () AS k FROM r) r
			  JOIN (SELECT n, row_number() OVER () AS k FROM unnest($2::uuid[]) n) nn USING (k)
			)
			INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during)
			SELECT id, 0, n, 'gpu', 'gpu', 'h100', 1, int4range(g * 64, g * 64 + 64), tstzrange(now() - interval '1 minute', NULL)
			FROM pairs, generate_series(0, 7) g WHERE (k - 1) * 8 + g < $3`, pool, full, live)
		if err != nil {
			return err
		}
	}
	gpus := 8 * util / 100
	if gpus > 0 {
		_, err := db.Pool.Exec(ctx, `WITH r AS (
			  INSERT INTO compute.reservations (id, tenant_id, pool_id, state, shape, members, starts_at, created_by)
			  SELECT gen_random_uuid(), 'root', $1, 'active', '{}', 1, now() - interval '1 minute', 'fill' FROM unnest($2::uuid[]) n
			  RETURNING id
			), pairs AS (
			  SELECT r.id, n FROM (SELECT id, row_number() OVER () AS k FROM r) r
			  JOIN (SELECT n, row_number() OVER () AS k FROM unnest($2::uuid[]) n) nn ON nn.k = r.k
			)
			INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during)
			SELECT id, 0, n, 'gpu', 'gpu', 'h100', $3::int, int4range(0, $3::int * 64), tstzrange(now() - interval '1 minute', NULL) FROM pairs`,
			pool, nodes, gpus)
		if err != nil {
			return err
		}
	}
	if err := capacity.RefreshNodes(ctx, db.Pool, append(append([]string{}, full...), nodes...)...); err != nil {
		return err
	}
	// What autovacuum would do after a bulk change, done now rather than during the measurement,
	// where it would compete for the same cores: dead rows gone, fresh statistics for the planner.
	if _, err := db.Pool.Exec(ctx, `VACUUM (ANALYZE) compute.node_capacity, compute.bookings, compute.reservations, compute.nodes`); err != nil {
		return err
	}
	// And the checkpoint the fill's WAL would bring on: during the measurement it writes the
	// fill's pages and makes the first change of every page after it log the whole page.
	_, err := db.Pool.Exec(ctx, `CHECKPOINT`)
	return err
}

// explainCandidates prints the plan of the best-fit candidate query a placement of one H100 runs,
// as the pool stands.
func explainCandidates(ctx context.Context, db *postgres.DB, pool string) {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // lets go of the node it locked
	lines, err := capacity.ExplainCandidates(ctx, tx, pool, "h100", 1)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, l)
	}
}

// measure runs count operations from clients goroutines and returns the rate and latencies.
// slow is -slow: operations slower than it are printed.
var slow *time.Duration

func measure(clients, count int, op func() error) (rate float64, p50, p99, slowest time.Duration, fails int) {
	var next atomic.Int64
	lat := make([]time.Duration, count)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= count {
					return
				}
				t := time.Now()
				if err := op(); err != nil {
					failed.Add(1)
					if failed.Load() == 1 {
						fmt.Fprintln(os.Stderr, "placebench:", err)
					}
				}
				lat[i] = time.Since(t)
				if *slow > 0 && lat[i] > *slow {
					fmt.Fprintf(os.Stderr, "slow: started %s after the start, took %s\n", t.Sub(start).Round(time.Millisecond), lat[i].Round(time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(count) / elapsed.Seconds(), lat[count/2], lat[count*99/100], lat[count-1], int(failed.Load())
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func splitInts(s string) []int {
	var out []int
	var cur, has = 0, false
	for _, r := range s + "," {
		if r >= '0' && r <= '9' {
			cur, has = cur*10+int(r-'0'), true
			continue
		}
		if has {
			out = append(out, cur)
		}
		cur, has = 0, false
	}
	return out
}

// printStatements prints the statements that took the most of the database's time since the last
// reset, per placement.
func printStatements(ctx context.Context, db *postgres.DB, placements int) {
	rows, err := db.Pool.Query(ctx, `SELECT total_exec_time, calls, left(regexp_replace(query, '\s+', ' ', 'g'), 100)
		FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 16`)
	if err != nil {
		log.Fatal(err)
	}
	var total float64
	var calls int64
	var q string
	_, err = pgx.ForEachRow(rows, []any{&total, &calls, &q}, func() error {
		fmt.Fprintf(os.Stderr, "%8.3f ms/placement %7d calls  %s\n", total/float64(placements), calls, q)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
