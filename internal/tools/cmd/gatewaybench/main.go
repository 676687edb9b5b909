// Command gatewaybench measures the gateway with a simulated fleet: it runs the control plane
// (API, gateway, worker, on an embedded PostgreSQL) in this process and -nodes simulated nodes in
// a child process, each with a real mutual-TLS session. It prints, as Markdown: command round
// trips (created → result recorded, by the database's clock) at p50/p99/p99.9; the control
// plane's CPU and memory while idle and under commands; the database writes that heartbeats
// cause; how many live nodes were marked offline while the fleet ran; and how long the fleet takes to be seen offline when its process is stopped (silent)
// or killed (its connections closed), and to be back when it resumes.
//
//	go run ./internal/tools/cmd/gatewaybench [-nodes 1000] [-commands 3000] [-clients 16] [-idle 30s] [-memprofile heap.pprof]
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/internal/lib/selfstat"
	"github.com/better-compute/compute/sim"
)

func main() {
	nodes := flag.Int("nodes", 1000, "simulated nodes")
	commands := flag.Int("commands", 3000, "commands to send")
	clients := flag.Int("clients", 16, "concurrent API clients sending commands")
	idle := flag.Duration("idle", 30*time.Second, "how long to watch an idle fleet")
	child := flag.Bool("child", false, "run the simulated fleet (internal)")
	url := flag.String("url", "", "(child) API URL")
	token := flag.String("token", "", "(child) join token")
	gateway := flag.String("gateway", "", "(child) gateway address")
	memProfile := flag.String("memprofile", "", "write a heap profile of the idle control plane to this file")
	flag.Parse()
	if *child {
		runFleet(*url, *token, *gateway, *nodes)
		return
	}
	ctx := context.Background()
	s, err := devserver.Start(ctx, devserver.Options{Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(ctx)
	a := s.Compute.API
	if _, err := a.Pools.Create(ctx, s.APIKey, api.CreatePool{Name: "sim"}); err != nil {
		log.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(ctx, s.APIKey, api.CreateJoinToken{Pool: "sim", MaxUses: *nodes})
	if err != nil {
		log.Fatal(err)
	}

	fmt.Fprintf(os.Stderr, "gatewaybench: starting %d simulated nodes\n", *nodes)
	cmd := exec.Command(os.Args[0], "-child", "-url", s.URL, "-token", jt.Token, "-gateway", s.Gateway, "-nodes", strconv.Itoa(*nodes))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	childReport := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			childReport <- sc.Text()
		}
	}()
	count := func(q string) int64 {
		var n int64
		if err := s.DB.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
			log.Fatal(err)
		}
		return n
	}
	start := time.Now()
	for count(`SELECT count(*) FROM compute.node_sessions s JOIN compute.nodes n ON n.id = s.node_id WHERE n.status = 'online'`) < int64(*nodes) {
		if time.Since(start) > 5*time.Minute {
			log.Fatal("gatewaybench: the fleet did not connect within 5 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	joined := time.Since(start)
	// Every node is live from here until the fleet's process is stopped: a node.offline event
	// meanwhile marked a live node offline (a heartbeat flush that fell behind its grace).
	lastEvent := count(`SELECT coalesce(max(id), 0) FROM compute.events`)
	fmt.Fprintf(os.Stderr, "gatewaybench: %d sessions up in %s; watching the idle fleet for %s\n", *nodes, joined.Round(time.Millisecond), *idle)
	// Let the joins' inventories settle and their statistics reach pg_stat_*, which backends
	// report up to seconds late.
	time.Sleep(10 * time.Second)

	// The idle fleet: heartbeats only.
	stats := func() (sessions, nodeRows, xacts int64) {
		err := s.DB.Pool.QueryRow(ctx, `SELECT
			  (SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'compute' AND relname = 'node_sessions'),
			  (SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'compute' AND relname = 'nodes'),
			  (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())`).Scan(&sessions, &nodeRows, &xacts)
		if err != nil {
			log.Fatal(err)
		}
		return
	}
	// Statistics reach pg_stat_* when a backend reports them: give it a moment each time.
	time.Sleep(time.Second)
	interval := s.Compute.HeartbeatInterval()
	s0, n0, x0 := stats()
	f0 := flushes(s.Compute.MetricsHandler)
	cpu0, t0 := selfstat.CPU(), time.Now()
	time.Sleep(*idle)
	time.Sleep(time.Second)
	s1, n1, x1 := stats()
	idleFlush := flushes(s.Compute.MetricsHandler).since(f0)
	idleCPU := (selfstat.CPU() - cpu0).Seconds() / time.Since(t0).Seconds()
	idleRSS := selfstat.RSSMiB()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	goroutines := runtime.NumGoroutine()
	secs := time.Since(t0).Seconds()
	if *memProfile != "" {
		writeHeapProfile(*memProfile)
	}

	// Commands.
	fmt.Fprintf(os.Stderr, "gatewaybench: sending %d commands from %d clients\n", *commands, *clients)
	rows, err := s.DB.Pool.Query(ctx, `SELECT id::text FROM compute.nodes ORDER BY id`)
	if err != nil {
		log.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	cpu1, t1 := selfstat.CPU(), time.Now()
	for range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= *commands {
					return
				}
				_, err := a.Commands.Create(ctx, s.APIKey, api.CreateCommand{NodeRef: api.NodeRef{Node: ids[i%len(ids)]}, Kind: api.CommandHealthCheck})
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for count(`SELECT count(*) FROM compute.commands WHERE finished_at IS NULL`) > 0 {
		if time.Since(t1) > 5*time.Minute {
			log.Fatal("gatewaybench: commands did not finish within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	loadSecs := time.Since(t1).Seconds()
	loadCPU := (selfstat.CPU() - cpu1).Seconds() / loadSecs
	loadRSS := selfstat.RSSMiB()
	var rtts []float64
	rows, err = s.DB.Pool.Query(ctx, `SELECT extract(epoch FROM finished_at - created_at) * 1000, state FROM compute.commands`)
	if err != nil {
		log.Fatal(err)
	}
	okCount := 0
	for rows.Next() {
		var ms float64
		var state string
		rows.Scan(&ms, &state)
		rtts = append(rtts, ms)
		if state == api.CommandSucceeded {
			okCount++
		}
	}
	rows.Close()
	sort.Float64s(rtts)
	pct := func(p float64) float64 { return rtts[min(len(rtts)-1, int(p*float64(len(rtts))))] }

	fmt.Fprintln(stdin, "report") // the child reports its own cost, and goes on
	fleetCost := <-childReport
	falseOffline := count(fmt.Sprintf(`SELECT count(*) FROM compute.events WHERE type = 'node.offline' AND id > %d`, lastEvent))

	// Offline detection, the fleet's process stopped (silent: no packet, no close), resumed,
	// then killed (every connection closed by the kernel at once).
	online := func() int64 { return count(`SELECT count(*) FROM compute.nodes WHERE status = 'online'`) }
	waitFor := func(done func(int64) bool, limit time.Duration) string {
		t0, shown := time.Now(), time.Now()
		for {
			n := online()
			if time.Since(shown) >= 5*time.Second {
				// Online nodes past their grace are the worker's backlog; the rest are waiting
				// out their grace.
				due := count(`SELECT count(*) FROM compute.nodes n JOIN compute.node_sessions s ON s.node_id = n.id
					WHERE n.status = 'online' AND s.offline_after <= compute.compute_now()`)
				fmt.Fprintf(os.Stderr, "gatewaybench:   %s: %d online, %d of them past their grace\n", time.Since(t0).Round(time.Second), n, due)
				shown = time.Now()
			}
			if done(n) {
				return time.Since(t0).Round(100 * time.Millisecond).String()
			}
			if time.Since(t0) > limit {
				return fmt.Sprintf("not within %s (%d online)", limit, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	fmt.Fprintf(os.Stderr, "gatewaybench: stopping the fleet's process (SIGSTOP)\n")
	_ = cmd.Process.Signal(syscall.SIGSTOP)
	silent := waitFor(func(n int64) bool { return n == 0 }, 2*time.Minute)
	fmt.Fprintf(os.Stderr, "gatewaybench: every node offline after %s; resuming it (SIGCONT)\n", silent)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	back := waitFor(func(n int64) bool { return n == int64(*nodes) }, 5*time.Minute)
	fmt.Fprintf(os.Stderr, "gatewaybench: every node online again after %s; killing it (SIGKILL)\n", back)
	_ = cmd.Process.Kill()
	closed := waitFor(func(n int64) bool { return n == 0 }, 2*time.Minute)
	_ = cmd.Wait()

	fmt.Printf("| measure | value |\n| --- | ---: |\n")
	fmt.Printf("| simulated nodes, sessions up | %d, in %s |\n", *nodes, joined.Round(time.Second))
	fmt.Printf("| heartbeat interval asked of nodes (every heartbeat's answer carries it) | %s |\n", interval)
	fmt.Printf("| commands (health.check), succeeded | %d, %d (%d not sent) |\n", *commands, okCount, failed.Load())
	fmt.Printf("| command round trip p50 / p99 / p99.9 | %.1f / %.1f / %.1f ms |\n", pct(0.50), pct(0.99), pct(0.999))
	fmt.Printf("| commands per second | %.0f |\n", float64(*commands)/loadSecs)
	fmt.Printf("| control plane CPU, idle / under commands | %.2f / %.2f cores |\n", idleCPU, loadCPU)
	fmt.Printf("| control plane memory (RSS), idle / after commands | %.0f / %.0f MiB |\n", idleRSS, loadRSS)
	fmt.Printf("| control plane, idle: heap in use, goroutine stacks, goroutines | %.0f MiB, %.0f MiB, %d |\n",
		float64(mem.HeapInuse)/(1<<20), float64(mem.StackInuse)/(1<<20), goroutines)
	fmt.Printf("| heartbeat writes, idle: session rows, node rows updated per second | %.0f, %.0f |\n", float64(s1-s0)/secs, float64(n1-n0)/secs)
	fmt.Printf("| database transactions per second, idle (every source) | %.1f |\n", float64(x1-x0)/secs)
	fmt.Printf("| heartbeat flushes, idle: count, mean, p99 at most | %d, %.0f ms, %s |\n", idleFlush.count, idleFlush.mean()*1000, idleFlush.p99())
	fmt.Printf("| live nodes marked offline while the fleet ran (idle and under commands) | %d |\n", falseOffline)
	fmt.Printf("| the simulated fleet's own process | %s |\n", fleetCost)
	fmt.Printf("| every node offline, the fleet's process stopped (silent) | %s |\n", silent)
	fmt.Printf("| every node online again, the process resumed | %s |\n", back)
	fmt.Printf("| every node offline, the process killed (connections closed) | %s |\n", closed)
	fmt.Printf("\n%s/%s, GOMAXPROCS %d; the control plane, the fleet and PostgreSQL share the machine.\n", runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
}

// flushHistogram is the gateway's heartbeat-flush duration histogram, as scraped.
type flushHistogram struct {
	count   uint64
	sum     float64
	uppers  []float64 // bucket upper bounds, seconds
	buckets []uint64  // cumulative counts
}

// flushes scrapes the control plane's flush histogram.
func flushes(metrics http.Handler) flushHistogram {
	rec := httptest.NewRecorder()
	metrics.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		log.Fatal(err)
	}
	var h flushHistogram
	for _, m := range fams["better_compute_gateway_flush_seconds"].GetMetric() {
		hist := m.GetHistogram()
		h.count, h.sum = hist.GetSampleCount(), hist.GetSampleSum()
		for _, b := range hist.GetBucket() {
			h.uppers = append(h.uppers, b.GetUpperBound())
			h.buckets = append(h.buckets, b.GetCumulativeCount())
		}
	}
	return h
}

// since is what h counted after earlier.
func (h flushHistogram) since(earlier flushHistogram) flushHistogram {
	d := flushHistogram{count: h.count - earlier.count, sum: h.sum - earlier.sum, uppers: h.uppers, buckets: slices.Clone(h.buckets)}
	for i := range d.buckets {
		if i < len(earlier.buckets) {
			d.buckets[i] -= earlier.buckets[i]
		}
	}
	return d
}

func (h flushHistogram) mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count)
}

// p99 is the smallest bucket bound at or under which 99 % of the flushes took.
func (h flushHistogram) p99() string {
	if h.count == 0 {
		return "no flush"
	}
	for i, c := range h.buckets {
		if float64(c) >= 0.99*float64(h.count) {
			return time.Duration(h.uppers[i] * float64(time.Second)).String()
		}
	}
	return "over the largest bucket"
}

// runFleet is the child: it runs the fleet until its stdin closes, printing its own cost at
// each line read.
func runFleet(url, token, gateway string, n int) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	f, err := sim.Start(ctx, sim.Options{URL: url, Token: token, Gateway: gateway, Nodes: n, Parallel: 32,
		MaxBackoff: 30 * time.Second}) // bcd's own: started at once, they reconnect as real agents would
	if err != nil {
		log.Fatal(err)
	}
	t0, c0 := time.Now(), selfstat.CPU()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		cores := (selfstat.CPU() - c0).Seconds() / time.Since(t0).Seconds()
		fmt.Printf("%.2f cores, %.0f MiB RSS for %d agents\n", cores, selfstat.RSSMiB(), n)
	}
	f.Stop()
}

// writeHeapProfile writes the live heap, after a collection, for go tool pprof.
func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		log.Fatal(err)
	}
}
