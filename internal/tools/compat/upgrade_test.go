package compat

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres/pgtest"
)

// upgradeSecret is the control planes' shared secret in the upgrade test.
const upgradeSecret = "compat-upgrade-secret-0123456789abcdef"

// controlPlane is a better-compute serve process of the upgrade test, with its log kept.
type controlPlane struct {
	*proc
	url, gw string
	log     *computetest.Buffer
	cl      *client.Client
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serveAt runs bin serve (all modes) on the database at dbURL, and waits for it to be ready.
func serveAt(t *testing.T, name, bin, dbURL string) *controlPlane {
	t.Helper()
	api, gw := freeAddr(t), freeAddr(t)
	cmd := exec.Command(bin, "serve", "--database-url", dbURL, "--secret", upgradeSecret, "--listen", api,
		"--gateway-listen", gw, "--gateway-hosts", "127.0.0.1", "--gateway-address", gw)
	log := &computetest.Buffer{}
	cmd.Stdout = io.Discard
	cmd.Stderr = io.MultiWriter(os.Stderr, log)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.kill)
	cp := &controlPlane{proc: p, url: "http://" + api, gw: gw, log: log}
	computetest.Eventually(t, 30*time.Second, name+" ready", func() bool {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited while starting: %v\n%s", name, err, log.String())
		default:
		}
		res, err := http.Get(cp.url + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return cp
}

// withKey gives cp a client with key.
func (cp *controlPlane) withKey(t *testing.T, key string) {
	t.Helper()
	cl, err := client.New(cp.url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	cp.cl = cl
}

// errorLines are the lines of the process's log at level ERROR.
func (cp *controlPlane) errorLines() []string {
	var out []string
	for _, l := range strings.Split(cp.log.String(), "\n") {
		if strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return out
}

// stopGracefully ends the process with SIGTERM and requires a clean exit.
func (cp *controlPlane) stopGracefully(t *testing.T, name string) {
	t.Helper()
	_ = cp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-cp.done:
		cp.done <- err
		if err != nil {
			t.Fatalf("%s did not stop cleanly: %v", name, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not stop within 30s of SIGTERM", name)
	}
}

// TestUpgradeInPlace upgrades a database with live data while an older control plane serves it:
// better-compute built at the oldest release of the window (N-2) serves an empty database and
// gets a fleet of simulated nodes (its own sim) and reservations; then this tree's binary
// starts on the same database, which it migrates, and both serve it at once. The old process
// must keep working on the migrated schema (expand-only migrations: it reads and writes what it
// knows, and what it does not know has defaults), the bookings invariant must hold across
// reservations made through either, no process may log an error, and the data must survive the
// old process's restart on the newer schema and its retirement.
func TestUpgradeInPlace(t *testing.T) {
	// Not parallel: its control planes listen on addresses freeAddr found free, which a test
	// beside it could take meanwhile.
	if testing.Short() {
		t.Skip("builds better-compute at an older commit")
	}
	from := releases[1]
	if from.name != "N-2" {
		t.Fatalf("releases[1] is %s: the upgrade starts from N-2, the oldest release of the window", from.name)
	}
	oldBin := buildAt(t, from.commit, "./cmd/better-compute")
	newBin := buildHere(t, "./cmd/better-compute")
	ctx := context.Background()
	dbURL := pgtest.URL(t) // empty: the old binary creates the schema
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)

	// The old control plane, its first key, and its fleet: 4 simulated nodes of 8 GPUs.
	old := serveAt(t, "the old control plane", oldBin, dbURL)
	out, err := exec.Command(oldBin, "iam", "admin-key", "--database-url", dbURL).Output()
	if err != nil {
		t.Fatalf("iam admin-key: %v", err)
	}
	key := strings.TrimSpace(string(out))
	old.withKey(t, key)
	if _, err := old.cl.Pools.Create(ctx, api.CreatePool{Name: "gpu"}); err != nil {
		t.Fatal(err)
	}
	tok, err := old.cl.JoinTokens.Create(ctx, api.CreateJoinToken{Pool: "gpu", MaxUses: 4})
	if err != nil {
		t.Fatal(err)
	}
	sim := start(t, oldBin, "sim", "--url", old.url, "--token", tok.Token, "--gateway", old.gw, "--nodes", "4", "--gpus", "8")
	online := func(cl *client.Client) bool {
		list, err := cl.Nodes.List(ctx, api.ListNodes{Pool: "gpu"})
		if err != nil || len(list.Items) != 4 {
			return false
		}
		for _, n := range list.Items {
			if n.Status != api.NodeOnline {
				return false
			}
		}
		sum, err := cl.Capacity.Summary(ctx, api.SummarizeCapacity{Pool: "gpu"})
		return err == nil && len(sum.Models) == 1 && sum.Models[0].Total == 32
	}
	computetest.Eventually(t, 30*time.Second, "4 nodes online with 32 GPUs through the old control plane", func() bool { return online(old.cl) })
	reserve := func(cl *client.Client, in api.CreateReservation) api.Reservation {
		t.Helper()
		r, err := cl.Reservations.Create(ctx, in)
		if err != nil {
			t.Fatalf("reserve %+v: %v", in.Shape, err)
		}
		return r
	}
	now8 := reserve(old.cl, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 8}})
	later := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
	future := reserve(old.cl, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 8}, Members: 2, Start: &later, Duration: "2h"})
	released := reserve(old.cl, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 2}})
	if _, err := old.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: released.ID}); err != nil {
		t.Fatal(err)
	}

	// This tree's control plane on the same database: it migrates, and both serve. While it
	// starts, the old one keeps booking and releasing: nothing it does may fail.
	busy, stopBusy := context.WithCancel(ctx)
	var calls int
	var busyErr error
	busyDone := make(chan struct{})
	go func() {
		defer close(busyDone)
		for busy.Err() == nil && busyErr == nil {
			r, err := old.cl.Reservations.Create(ctx, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 1}, Duration: "1h"})
			var ae *api.Error
			if errors.As(err, &ae) && ae.Details["reason"] == "contended" {
				continue // asked again, as a client would
			}
			if err == nil {
				_, err = old.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: r.ID})
			}
			if err == nil {
				_, err = old.cl.Nodes.List(ctx, api.ListNodes{Pool: "gpu"})
			}
			busyErr = err
			calls++
		}
	}()
	cur := serveAt(t, "this tree's control plane", newBin, dbURL)
	cur.withKey(t, key)
	stopBusy()
	<-busyDone
	if busyErr != nil || calls == 0 {
		t.Fatalf("the old control plane while the new one migrated: %d rounds, then %v", calls, busyErr)
	}
	t.Logf("the old control plane booked and released %d times while the new one started", calls)
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'compute' AND table_name IN ('approvals', 'tunnel_tickets')`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("the new binary's tables are not there after it started (%d, %v): it did not migrate", n, err)
	}
	for name, cp := range map[string]*controlPlane{"old": old, "new": cur} {
		for _, id := range []string{now8.ID, future.ID, released.ID} {
			r, err := cp.cl.Reservations.Get(ctx, api.GetReservation{Reservation: id})
			if err != nil {
				t.Fatalf("%s: reservation %s after the migration: %v", name, id, err)
			}
			want := map[string]string{now8.ID: api.ReservationActive, future.ID: api.ReservationPending, released.ID: api.ReservationReleased}[id]
			if r.State != want {
				t.Fatalf("%s: reservation %s is %s after the migration, want %s", name, id, r.State, want)
			}
		}
		if !online(cp.cl) {
			t.Fatalf("%s: the fleet is not 4 nodes online with 32 GPUs after the migration", name)
		}
	}

	// Both write on the migrated schema: a storm of reservations through both at once for the
	// 24 GPUs free for the next hour, and more than fit. Exactly what fits is granted; the rest
	// is refused with conflict, never an error.
	type answer struct {
		r   api.Reservation
		err error
	}
	answers := make(chan answer, 16)
	var wg sync.WaitGroup
	for i := range 16 {
		cl := old.cl
		if i%2 == 1 {
			cl = cur.cl
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// An hour, so that the future reservation's nodes can take them too. A request that
			// met others on the nodes it may fit asks again, as a client would.
			for {
				r, err := cl.Reservations.Create(ctx, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 2}, Duration: "1h"})
				var ae *api.Error
				if errors.As(err, &ae) && ae.Details["reason"] == "contended" {
					continue
				}
				answers <- answer{r, err}
				return
			}
		}()
	}
	wg.Wait()
	close(answers)
	granted := 0
	var refused []string
	for a := range answers {
		switch {
		case a.err == nil:
			granted++
		case api.CodeOf(a.err) != api.CodeConflict:
			t.Fatalf("a reservation in the storm failed with %v, want success or conflict", a.err)
		default:
			refused = append(refused, a.err.Error())
		}
	}
	if granted != 12 {
		t.Fatalf("the storm was granted %d reservations of 2 GPUs of the 24 free, want 12; refused:\n%s", granted, strings.Join(refused, "\n"))
	}
	checkBookings(t, db)

	// A pool made through the new process, with a field the old one does not know, is read by the
	// old one; a reservation made by one is released by the other.
	if _, err := cur.cl.Pools.Create(ctx, api.CreatePool{Name: "attested", Attestation: &api.PoolAttestation{TPM: api.TPMOptional}}); err != nil {
		t.Fatal(err)
	}
	if p, err := old.cl.Pools.Get(ctx, api.GetPool{Pool: "attested"}); err != nil || p.Name != "attested" {
		t.Fatalf("the old process reading a pool the new one made: %+v, %v", p, err)
	}
	if _, err := cur.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: now8.ID}); err != nil {
		t.Fatal(err)
	}
	back := reserve(old.cl, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 8}})
	if _, err := cur.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: back.ID}); err != nil {
		t.Fatal(err)
	}

	// The old process restarts on the newer schema (as a replica of a rolling upgrade does): the
	// migrations it knows are applied, and it serves with the newer ones in place.
	old.stopGracefully(t, "the old control plane")
	restarted := serveAt(t, "the old control plane, restarted", oldBin, dbURL)
	restarted.withKey(t, key)
	if r, err := restarted.cl.Reservations.Get(ctx, api.GetReservation{Reservation: future.ID}); err != nil || r.State != api.ReservationPending {
		t.Fatalf("the restarted old process reading the future reservation: %+v, %v", r, err)
	}
	if _, err := restarted.cl.Reservations.Create(ctx, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 1}}); err != nil && api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("the restarted old process reserving: %v", err)
	}
	checkBookings(t, db)

	// The old process retires; the new one holds the data, and the nodes come to it.
	restarted.stopGracefully(t, "the restarted old control plane")
	if r, err := cur.cl.Reservations.Get(ctx, api.GetReservation{Reservation: future.ID}); err != nil || r.State != api.ReservationPending || r.Shape.GPUs != 8 || r.Members != 2 {
		t.Fatalf("the future reservation after the old process left: %+v, %v", r, err)
	}
	sim.stop(t)
	for name, cp := range map[string]*controlPlane{"old": old, "old, restarted": restarted, "new": cur} {
		if lines := cp.errorLines(); len(lines) > 0 {
			t.Errorf("the %s control plane logged errors:\n%s", name, strings.Join(lines, "\n"))
		}
	}
}

// checkBookings asserts the bookings invariant on the database: no two bookings hold one atom at
// one instant, no ended reservation holds anything past its end, and every node's GPU rollup
// adds up to what its bookings hold now.
func checkBookings(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	for what, sql := range map[string]string{
		"pairs of bookings hold one atom at one instant": `SELECT count(*) FROM compute.bookings a JOIN compute.bookings b ON a.id < b.id
			AND a.node_id = b.node_id AND a.resource = b.resource AND a.atoms && b.atoms AND a.during && b.during`,
		"bookings of ended reservations reach past their end": `SELECT count(*) FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
			WHERE r.state NOT IN ('pending', 'active') AND (upper_inf(b.during) OR upper(b.during) > r.ended_at)`,
		"nodes' GPU rollups do not add up": `SELECT count(*) FROM compute.node_capacity nc WHERE nc.gpus_free + nc.gpus_spot + (
			SELECT count(*) FROM compute.devices d WHERE d.node_id = nc.node_id AND d.mode = 'whole' AND EXISTS (
				SELECT 1 FROM compute.bookings b WHERE b.node_id = d.node_id AND b.resource = 'gpu' AND NOT b.spot
				AND b.during @> compute.compute_now() AND b.atoms && int4range(d.index * 64, d.index * 64 + 64))
			) <> nc.gpus_total`,
	} {
		var n int
		if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n != 0 {
			t.Fatalf("%d %s", n, what)
		}
	}
}
