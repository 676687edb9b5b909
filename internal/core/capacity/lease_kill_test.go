package capacity_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/postgres"
)

// The environment that makes the test binary the lease holder of TestKilledHolderMidStorm: the
// database URL and the pool.
const (
	leaseChildEnv     = "BC_CAPACITY_LEASE_CHILD_DB"
	leaseChildPoolEnv = "BC_CAPACITY_LEASE_CHILD_POOL"
)

// killLeaseTTL is the lease time of both processes of TestKilledHolderMidStorm.
const killLeaseTTL = 2 * time.Second

// stormOps is one client's loop of TestKilledHolderMidStorm, in either process: it holds up to
// three reservations (one or two GPUs, now and then one with vCPUs, placed by the ordinary path),
// creating when it holds fewer and releasing one of its own otherwise, and reports each
// acknowledged create and release. Errors other than no room are reported too.
func stormOps(ctx context.Context, c *compute.Compute, key string, seed uint64, ack func(kind, id string)) {
	rng := rand.New(rand.NewPCG(seed, 7))
	var held []string
	for ctx.Err() == nil {
		if len(held) < 3 && rng.IntN(3) > 0 {
			in := api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 1 + rng.IntN(2)}}
			if rng.IntN(8) == 0 {
				in.Shape.VCPUs = 2
			}
			r, err := c.API.Reservations.Create(ctx, key, in)
			switch {
			case err == nil:
				held = append(held, r.ID)
				ack("placed", r.ID)
			case api.CodeOf(err) != api.CodeConflict && ctx.Err() == nil:
				ack("error", strings.ReplaceAll(err.Error(), "\n", " "))
			}
			continue
		}
		if len(held) == 0 {
			continue
		}
		i := rng.IntN(len(held))
		id := held[i]
		held = append(held[:i], held[i+1:]...)
		// A release in flight when the storm stops (cancelled, or its process killed) may have
		// committed without its answer: said before it is asked, it is either state after.
		ack("releasing", id)
		if _, err := c.API.Reservations.Release(ctx, key, api.ReleaseReservation{Reservation: id}); err == nil {
			ack("released", id)
		} else if ctx.Err() == nil {
			ack("error", strings.ReplaceAll(err.Error(), "\n", " "))
		}
	}
}

// leaseChild is the other process of TestKilledHolderMidStorm: a control plane in the api mode on
// the test's database that takes pool's lease, says "ready", then storms the pool from 8 clients,
// printing each acknowledged create and release, and how many calls it placed from memory, until
// it is killed.
func leaseChild(url, pool string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "lease child:", err)
		os.Exit(2)
	}
	db, err := postgres.Open(ctx, url)
	if err != nil {
		fail(err)
	}
	local, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: computetest.RootTenantID})
	if err != nil {
		fail(err)
	}
	c, err := compute.New(compute.Options{Database: db, Secret: computetest.Secret, BaseURL: "http://compute.test",
		RootTenantID: computetest.RootTenantID, IAM: local, Mode: compute.ModeAPI, PoolLeaseTTL: killLeaseTTL,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		fail(err)
	}
	if err := c.Initialize(ctx); err != nil {
		fail(err)
	}
	if err := c.Start(ctx); err != nil {
		fail(err)
	}
	key, err := local.CreateAdminKey(ctx, computetest.RootTenantID, "lease-child")
	if err != nil {
		fail(err)
	}
	leases := leasesOf(c)
	if err := leases.Await(ctx, pool); err != nil {
		fail(err)
	}
	var mu sync.Mutex
	say := func(kind, what string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(os.Stdout, kind, what)
	}
	say("ready", leases.Holder())
	for i := range 8 {
		go stormOps(ctx, c, key.Token, uint64(1000+i), say)
	}
	report := time.NewTicker(50 * time.Millisecond) // how many it placed from memory, now and then
	defer report.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-report.C:
			say("memory", strconv.FormatInt(leases.Stats().Placed, 10))
		}
	}
}

// TestKilledHolderMidStorm: the test binary, run again as a second process, holds the pool's
// lease and places from memory under a storm of calls from both processes; it is killed
// (SIGKILL) mid-storm. Afterwards no two bookings overlap, every placement and release either
// process acknowledged is in the database, every rollup equals a recount, and placements go on:
// this process takes the lease within a bound derived from the lease time and places from memory.
func TestKilledHolderMidStorm(t *testing.T) {
	// Not parallel: its lease takeover is bounded in time, which tests beside it would slow.
	if testing.Short() {
		t.Skip("a storm of two processes, one killed")
	}
	f := newFleet(t, fleetSpec{nodes: 8, gpus: 8, domains: 2, vcpus: 32, leaseTTL: killLeaseTTL})
	f.DB.ResetNow() // the child reads the real clock: so does this process

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaseChildEnv+"="+f.DB.Pool.Config().ConnString(), leaseChildPoolEnv+"="+f.pool.ID)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// What each process acknowledged: id → "placed" or "released".
	var mu sync.Mutex
	acked := map[string]string{}
	var failures []string
	var parentOps atomic.Int64 // placements and releases this process had answered
	ack := func(who string) func(kind, what string) {
		return func(kind, what string) {
			mu.Lock()
			defer mu.Unlock()
			switch kind {
			case "placed", "releasing", "released":
				acked[what] = kind
				if who == "parent" {
					parentOps.Add(1)
				}
			case "error":
				failures = append(failures, who+": "+what)
			}
		}
	}
	ready := make(chan string, 1)
	var childMemory atomic.Int64
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		childAck := ack("child")
		for sc.Scan() {
			kind, what, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case "ready":
				ready <- what
			case "memory":
				n, _ := strconv.ParseInt(what, 10, 64)
				childMemory.Store(n)
			default:
				childAck(kind, what)
			}
		}
	}()
	var childHolder string
	select {
	case childHolder = <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("the child did not take the lease")
	}
	if h, e, live := f.leaseRow(t); h != childHolder || !live || !strings.Contains(h, fmt.Sprintf("/%d/", cmd.Process.Pid)) {
		t.Fatalf("lease = %s (epoch %d, live %v), want the child's (pid %d)", h, e, live, cmd.Process.Pid)
	}
	_, childEpoch, _ := f.leaseRow(t)

	// This process storms too: through the database while the child holds the lease.
	if err := f.Compute.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	mine := leasesOf(f.Compute)
	ctx, cancel := context.WithCancel(f.ctx)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { stormOps(ctx, f.Compute, f.RootKey, uint64(i), ack("parent")) })
	}
	defer func() { cancel(); wg.Wait() }()
	// A few placements from memory are enough to be mid-storm: while this process books through
	// the database the holder's view goes stale and it reloads often, so on a loaded CI machine
	// it places only a handful a second.
	computetest.Eventually(t, 90*time.Second, "the child placing from memory", func() bool { return childMemory.Load() >= 20 })
	// Mid-storm: both processes still at it, the child placing more from memory and this one
	// having more answered.
	child, parent := childMemory.Load(), parentOps.Load()
	computetest.Eventually(t, 30*time.Second, "both processes placing", func() bool {
		return childMemory.Load() > child && parentOps.Load() > parent
	})
	if mine.Held(f.pool.ID) {
		t.Fatal("both processes hold the lease")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = cmd.Wait()
	<-lines

	// The survivor takes the lease once the dead holder's expires: the lease time, a renewal
	// round, the load. Three lease times is generous on a busy machine and still "within seconds".
	computetest.Eventually(t, 30*time.Second, "the survivor taking the lease", func() bool { return mine.Held(f.pool.ID) })
	took := time.Since(killed)
	if bound := 3 * killLeaseTTL; took > bound {
		t.Errorf("the lease was taken over %s after the holder was killed; want within %s (lease time %s)", took, bound, killLeaseTTL)
	}
	if h, e, _ := f.leaseRow(t); h != mine.Holder() || e <= childEpoch {
		t.Errorf("lease = %s epoch %d, want this process's, after epoch %d", h, e, childEpoch)
	}
	before := mine.Stats().Placed
	computetest.Eventually(t, 30*time.Second, "placements resuming from memory", func() bool { return mine.Stats().Placed-before >= 50 })
	cancel()
	wg.Wait()
	t.Logf("lease taken over %s after the kill (lease time %s); the child placed %d from memory; this process: %+v",
		took.Round(time.Millisecond), killLeaseTTL, childMemory.Load(), mine.Stats())

	for i, msg := range failures {
		if i == 10 {
			t.Errorf("… and %d more", len(failures)-10)
			break
		}
		t.Error(msg)
	}
	if n := computetest.Count(t, f.DB.Pool, `SELECT count(*) FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id AND a.node_id = b.node_id
		AND a.resource = b.resource AND a.atoms && b.atoms AND a.during && b.during`); n != 0 {
		t.Errorf("%d pairs of bookings hold one atom at one instant", n)
		f.logOverlaps(t)
	}
	count := map[string]int{}
	for id, kind := range acked {
		var state string
		err := f.DB.Pool.QueryRow(f.ctx, `SELECT state FROM compute.reservations WHERE id = $1`, id).Scan(&state)
		switch {
		case err != nil:
			t.Errorf("acknowledged reservation %s: %v", id, err)
		case kind == "released" && state != api.ReservationReleased:
			t.Errorf("reservation %s was acknowledged released but is %s", id, state)
		case kind == "placed" && state != api.ReservationActive:
			t.Errorf("reservation %s was acknowledged placed (and not released) but is %s", id, state)
		case kind == "releasing" && state != api.ReservationActive && state != api.ReservationReleased:
			t.Errorf("reservation %s was placed and its release unanswered, but is %s", id, state)
		}
		count[kind]++
	}
	drift, err := capacity.Drift(f.ctx, f.DB.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range drift {
		t.Errorf("rollup drift: %s", d)
	}
	t.Logf("%d acknowledged reservations found (%d still held, %d released, %d with a release unanswered)",
		len(acked), count["placed"], count["released"], count["releasing"])
}

// logOverlaps logs what the exclusion constraint should have made impossible: some of the pairs of
// bookings that overlap, with their reservations' states, and whether the constraint and its index
// are there and valid. (Seen once, in a run beside another full run of the package.)
func (f *testFleet) logOverlaps(t *testing.T) {
	t.Helper()
	computetest.LogRows(t, f.DB.Pool, "overlap", `SELECT format('%s/%s xmin %s %s %s %s %s created %s ended %s | %s/%s xmin %s %s %s %s %s created %s ended %s',
		a.id, a.reservation_id, a.xmin, ra.state, a.resource, a.atoms, a.during, ra.created_at, ra.ended_at,
		b.id, b.reservation_id, b.xmin, rb.state, b.resource, b.atoms, b.during, rb.created_at, rb.ended_at)
		FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id AND a.node_id = b.node_id AND a.resource = b.resource
		  AND a.atoms && b.atoms AND a.during && b.during
		JOIN compute.reservations ra ON ra.id = a.reservation_id JOIN compute.reservations rb ON rb.id = b.reservation_id
		ORDER BY a.id LIMIT 10`)
	var constraint, valid string
	err := f.DB.Pool.QueryRow(f.ctx, `SELECT coalesce(string_agg(c.conname::text || ' ' || c.contype::text, ','), 'none'),
		coalesce(string_agg(i.indisvalid::text || '/' || i.indisready::text, ','), 'none')
		FROM pg_catalog.pg_constraint c LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = c.conindid
		WHERE c.conrelid = 'compute.bookings'::regclass AND c.contype = 'x'`).Scan(&constraint, &valid)
	t.Logf("exclusion constraints of compute.bookings: %s; index valid/ready: %s (%v)", constraint, valid, err)
}
