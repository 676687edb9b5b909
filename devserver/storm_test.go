package devserver_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/internal/core/capacity"
)

var (
	stormFor     = flag.Duration("storm.duration", 20*time.Second, "how long TestStorm's clients run (the hardening issue's figure is 60s)")
	stormClients = flag.Int("storm.clients", 40, "TestStorm's concurrent clients")
	stormStrict  = flag.Bool("storm.strict", false, "TestStorm fails when a call takes longer than 2s (a target not yet met on 2 cores: docs/capacity.md)")
)

// stormLimit is the slowest answer TestStorm accepts.
const stormLimit = 2 * time.Second

// stormShapes are what the storm's clients ask for: the batched shape, NVLink, gangs, vCPU and
// memory, spot, short reservations the worker expires mid-storm, and future ones.
var stormShapes = []api.CreateReservation{
	{Shape: api.Shape{GPUs: 1}},
	{Shape: api.Shape{GPUs: 2}},
	{Shape: api.Shape{GPUs: 4, NVLink: true}},
	{Shape: api.Shape{GPUs: 1}, Members: 2},
	{Shape: api.Shape{GPUs: 1, VCPUs: 1, MemoryGiB: 1}},
	{Shape: api.Shape{GPUs: 1}, Spot: true},
	{Shape: api.Shape{GPUs: 2}, Spot: true},
	{Shape: api.Shape{GPUs: 1}, Duration: "3s"},
	{Shape: api.Shape{GPUs: 2}, Duration: "1m"}, // given a start 20 s ahead
}

// stormStats is what one client saw.
type stormStats struct {
	calls, noRoom int
	latencies     []time.Duration
	failures      []string
	slow          []string          // calls over stormLimit
	created       map[string]bool   // acknowledged creates
	ended         map[string]string // acknowledged releases and cancels: id → state
}

// TestStorm: 40 clients place, release and cancel reservations of mixed shapes through the
// devserver's HTTP API, with its own defaults and simulated nodes, for -storm.duration. No call
// may be answered internal or unavailable, or name a constraint; then SQL finds no atom held
// twice, no rollup that disagrees with a recount, and every acknowledged write in place. Calls
// slower than 2 s are reported, and fail the test with -storm.strict. STORM_SAMPLE=1 prints, each
// second, which statements block others, and what the blockers run.
func TestStorm(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a storm of calls for -storm.duration")
	}
	ctx := context.Background()
	s, err := devserver.Start(ctx, devserver.Options{Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Sim: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	c, err := client.New(s.URL, client.WithAPIKey(s.APIKey), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(*stormFor)
	stats := make([]*stormStats, *stormClients)
	var wg sync.WaitGroup
	for i := range stats {
		st := &stormStats{created: map[string]bool{}, ended: map[string]string{}}
		stats[i] = st
		wg.Go(func() { storm(ctx, c, st, rand.New(rand.NewPCG(uint64(i), 1)), deadline) })
	}
	if os.Getenv("STORM_SAMPLE") != "" {
		go func() {
			sample := time.NewTicker(time.Second) // a sample a second, for the person reading
			defer sample.Stop()
			for time.Now().Before(deadline) {
				<-sample.C
				rows, err := s.DB.Pool.Query(ctx, `SELECT coalesce(b.wait_event_type, '') || ':' || coalesce(b.state, ''), left(regexp_replace(b.query, '\s+', ' ', 'g'), 70),
					count(*)::int, max(now() - a.xact_start), max(now() - b.xact_start)
					FROM pg_stat_activity a, unnest(pg_blocking_pids(a.pid)) bp JOIN pg_stat_activity b ON b.pid = bp
					WHERE a.datname = current_database() GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 6`)
				if err != nil {
					continue
				}
				for rows.Next() {
					var w, q string
					var n int
					var age, bage *time.Duration
					_ = rows.Scan(&w, &q, &n, &age, &bage)
					fmt.Printf("blocks %3d (oldest %v): blocker %s %v %s\n", n, age, w, bage, q)
				}
				rows.Close()
				fmt.Println("--")
			}
		}()
	}
	wg.Wait()

	var all []time.Duration
	var failures []string
	calls, noRoom := 0, 0
	for _, st := range stats {
		all = append(all, st.latencies...)
		failures = append(failures, st.failures...)
		calls, noRoom = calls+st.calls, noRoom+st.noRoom
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	t.Logf("storm: %d clients for %s: %d calls (%.0f/s), %d answered no room; latency p50 %s p99 %s max %s",
		len(stats), *stormFor, calls, float64(calls)/stormFor.Seconds(), noRoom, pct(0.5), pct(0.99), all[len(all)-1])
	// The devserver holds its pool's lease (the pool-lease placer is on by default): what it
	// placed from memory, what memory had no room for, and what the database refused of memory.
	if l := s.Compute.Runtime().Capacity.(capacity.Service).Leases; l.On() {
		t.Logf("storm: pool lease: %+v", l.Stats())
	}
	for i, f := range failures {
		if i == 20 {
			t.Errorf("… and %d more", len(failures)-20)
			break
		}
		t.Error(f)
	}
	var slow []string
	for _, st := range stats {
		slow = append(slow, st.slow...)
	}
	if len(slow) > 0 {
		report := t.Logf
		if *stormStrict {
			report = t.Errorf
		}
		report("%d calls (%.1f%%) took longer than %s, the slowest %s; for example %s", len(slow),
			100*float64(len(slow))/float64(len(all)), stormLimit, all[len(all)-1], slow[0])
	}

	// What SQL finds afterwards. First: nothing is left holding a transaction open.
	lrows, err := s.DB.Pool.Query(ctx, `SELECT state || ' ' || coalesce(wait_event_type, '') || ' for ' || (now() - xact_start)::text || ': ' || left(query, 200)
		FROM pg_stat_activity WHERE datname = current_database() AND xact_start < now() - interval '5 seconds'`)
	if err != nil {
		t.Fatal(err)
	}
	for lrows.Next() {
		var what string
		_ = lrows.Scan(&what)
		t.Errorf("a transaction is still open: %s", what)
	}
	lrows.Close()
	var n int
	if err := s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id
		AND a.node_id = b.node_id AND a.resource = b.resource AND a.atoms && b.atoms AND a.during && b.during`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d pairs of bookings hold one atom at one instant", n)
	}
	// The worker applies what the clock passed (it skips nodes another transaction holds, its
	// own tick among them, until its next tick); then every rollup is a recount.
	var drift []capacity.NodeDrift
	defer func() {
		for _, d := range drift {
			t.Errorf("rollup drift: %s", d)
		}
	}()
	computetest.Eventually(t, 20*time.Second, "every rollup a recount, after the clock's ticks", func() bool {
		if _, err := capacity.Tick(ctx, s.DB); err != nil {
			t.Fatal(err)
		}
		if drift, err = capacity.Drift(ctx, s.DB.Pool); err != nil {
			t.Fatal(err)
		}
		return len(drift) == 0
	})
	created, ended := 0, 0
	for _, st := range stats {
		for id := range st.created {
			created++
			var state string
			if err := s.DB.Pool.QueryRow(ctx, `SELECT state FROM compute.reservations WHERE id = $1`, id).Scan(&state); err != nil {
				t.Errorf("acknowledged reservation %s: %v", id, err)
				continue
			}
			if want, ok := st.ended[id]; ok && state != want {
				t.Errorf("reservation %s was acknowledged %s but is %s", id, want, state)
			}
		}
		ended += len(st.ended)
	}
	t.Logf("storm: %d acknowledged creates and %d acknowledged ends, all found", created, ended)
}

// storm is one client's loop: it holds up to three reservations, creating when it holds fewer
// and ending one of its own otherwise, with a read now and then; at the deadline it ends what it
// still holds.
func storm(ctx context.Context, c *client.Client, st *stormStats, rng *rand.Rand, deadline time.Time) {
	var held []string
	call := func(what string, fn func() error) error {
		start := time.Now()
		err := fn()
		d := time.Since(start)
		st.calls++
		st.latencies = append(st.latencies, d)
		if d > stormLimit {
			st.slow = append(st.slow, fmt.Sprintf("%s took %s (%v)", what, d.Round(time.Millisecond), err))
		}
		var ae *api.Error
		switch {
		case err == nil:
		case errors.As(err, &ae) && ae.Code == api.CodeConflict && ae.Details["constraint"] == nil:
			st.noRoom++
		case errors.As(err, &ae) && ae.Code == api.CodeFailedPrecondition:
			// Ended meanwhile: preempted, or expired by the worker.
		default:
			st.failures = append(st.failures, fmt.Sprintf("%s: %v", what, err))
		}
		return err
	}
	end := func(i int) {
		id := held[i]
		held = slices.Delete(held, i, i+1)
		var r api.Reservation
		err := call("release", func() (err error) {
			r, err = c.Reservations.Release(ctx, api.ReleaseReservation{Reservation: id})
			return err
		})
		if err == nil {
			st.ended[id] = api.ReservationReleased
			return
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Details["state"] == api.ReservationPending {
			if call("cancel", func() (err error) {
				r, err = c.Reservations.Cancel(ctx, api.CancelReservation{Reservation: id})
				return err
			}) == nil {
				st.ended[id] = api.ReservationCancelled
			}
		}
		_ = r
	}
	for time.Now().Before(deadline) {
		switch {
		case rng.IntN(10) == 0:
			_ = call("list", func() error {
				_, err := c.Reservations.List(ctx, api.ListReservations{Pool: devserver.SimPool, State: api.ReservationActive})
				return err
			})
		case len(held) < 3 && rng.IntN(3) > 0:
			in := stormShapes[rng.IntN(len(stormShapes))]
			in.Pool = devserver.SimPool
			if in.Duration == "1m" {
				in.Start = new(time.Now().Add(20 * time.Second))
			}
			var r api.Reservation
			if call(fmt.Sprintf("create %+v members %d spot %v start %v", in.Shape, in.Members, in.Spot, in.Start != nil), func() (err error) {
				r, err = c.Reservations.Create(ctx, in)
				return err
			}) == nil {
				st.created[r.ID] = true
				held = append(held, r.ID)
			}
		case len(held) > 0:
			end(rng.IntN(len(held)))
		}
	}
	for len(held) > 0 {
		end(0)
	}
}
