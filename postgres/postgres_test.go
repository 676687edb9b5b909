package postgres_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testSet is a small set of its own, so tests can watch it being applied.
var testSet = postgres.MigrationSet{Name: "probe", Schema: "probe", FS: fstest.MapFS{
	"00001_probe.sql": {Data: []byte(`-- +goose Up
CREATE TABLE probe.applied (id serial PRIMARY KEY, at timestamptz NOT NULL DEFAULT compute.compute_now());
INSERT INTO probe.applied DEFAULT VALUES;
-- +goose Down
DROP TABLE probe.applied;
`)},
}}

func TestComputeNowOverride(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core)

	var real time.Time
	if err := db.Pool.QueryRow(ctx, "SELECT compute.compute_now()").Scan(&real); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(real); d < -time.Minute || d > time.Minute {
		t.Fatalf("compute_now() = %v without an override, want about now", real)
	}

	// A session override, set with plain SQL.
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got time.Time
	err = conn.QueryRow(ctx, "SELECT set_config('compute.now', '2031-05-06T07:08:09Z', false)::text, compute.compute_now()").Scan(new(string), &got)
	conn.Release()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("compute_now() with a session override = %v, want %v", got, want)
	}

	// The pool's test clock reaches every connection it hands out, including that one.
	at := time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
	db.SetNow(at)
	for range 20 {
		if err := db.Pool.QueryRow(ctx, "SELECT compute.compute_now()").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if !got.Equal(at) {
			t.Fatalf("compute_now() after SetNow = %v, want %v", got, at)
		}
	}
	db.ResetNow()
	if err := db.Pool.QueryRow(ctx, "SELECT compute.compute_now()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got.Year() == 2040 || got.Year() == 2031 {
		t.Fatalf("compute_now() after ResetNow = %v, want the real time", got)
	}
}

func TestEmptySearchPath(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, postgres.Core)
	// An unqualified name must not resolve: every query names its schema.
	_, err := db.Pool.Exec(context.Background(), "SELECT compute_now()")
	if err == nil {
		t.Fatal("an unqualified compute_now() resolved; the test database's search_path must be empty")
	}
}

func TestMigrateTwiceUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	for range 2 {
		if err := postgres.Migrate(ctx, db, postgres.Core, testSet); err != nil {
			t.Fatal(err)
		}
	}
	if n := computetest.Count(t, db.Pool, "SELECT count(*) FROM probe.applied"); n != 1 {
		t.Fatalf("the probe migration ran %d times, want 1", n)
	}
	if pending, err := postgres.Pending(ctx, db, postgres.Core, testSet); err != nil || pending {
		t.Fatalf("Pending after Migrate = %v, %v; want false", pending, err)
	}
	if err := postgres.MigrateDown(ctx, db, postgres.Core, testSet); err != nil {
		t.Fatal(err)
	}
	if n := computetest.Count(t, db.Pool, "SELECT count(*) FROM pg_proc WHERE proname = 'compute_now'"); n != 0 {
		t.Fatalf("compute_now() survived MigrateDown")
	}
	if err := postgres.Migrate(ctx, db, postgres.Core, testSet); err != nil {
		t.Fatal(err)
	}
	if n := computetest.Count(t, db.Pool, "SELECT count(*) FROM probe.applied"); n != 1 {
		t.Fatalf("after down and up, probe.applied has %d rows, want 1", n)
	}
}

func TestMigrationSetErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for name, sets := range map[string][]postgres.MigrationSet{
		"duplicate name": {postgres.Core, postgres.Core},
		"bad schema":     {{Name: "x", Schema: "Bad-Schema", FS: fstest.MapFS{}}},
		"no files":       {{Name: "x", Schema: "x"}},
	} {
		if err := postgres.Migrate(context.Background(), db, sets...); err == nil {
			t.Errorf("%s: Migrate succeeded, want an error", name)
		}
	}
}

// TestMigrateConcurrentProcesses starts several copies of this test binary that migrate one
// database at the same moment; each migration must be applied exactly once.
func TestMigrateConcurrentProcesses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const procs = 4
	var wg sync.WaitGroup
	errs := make([]error, procs)
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMigrate$")
			cmd.Env = append(os.Environ(), "PGTEST_HELPER_MIGRATE_URL="+url)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("process %d: %v\n%s", i, err, out)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	db := pgtest.Open(t, url)
	if n := computetest.Count(t, db.Pool, "SELECT count(*) FROM probe.applied"); n != 1 {
		t.Fatalf("%d processes migrating at once applied the probe migration %d times, want 1", procs, n)
	}
}

// TestHelperMigrate is the child of TestMigrateConcurrentProcesses.
func TestHelperMigrate(t *testing.T) {
	t.Parallel()
	url := os.Getenv("PGTEST_HELPER_MIGRATE_URL")
	if url == "" {
		t.Skip("only run as a child of TestMigrateConcurrentProcesses")
	}
	ctx := context.Background()
	db, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := postgres.Migrate(ctx, db, postgres.Core, testSet); err != nil {
		t.Fatal(err)
	}
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := postgres.Open(ctx, ""); err == nil {
		t.Error("Open(\"\") succeeded")
	}
	if _, err := postgres.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"); err == nil {
		t.Error("Open of a closed port succeeded")
	}
}

// TestErrorClasses: a connection cut by the server, a refused connect and a shutdown are
// Unavailable; a statement's own error is not; a deadlock is Retryable.
func TestErrorClasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SELECT 1`)
	if err == nil || !postgres.Unavailable(err) {
		t.Errorf("a query on a terminated connection: %v; want Unavailable", err)
	}
	if postgres.Retryable(err) {
		t.Errorf("a cut connection is not Retryable: the transaction may have committed")
	}

	_, err = postgres.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if !postgres.Unavailable(err) {
		t.Errorf("a refused connect: %v; want Unavailable", err)
	}

	_, err = db.Pool.Exec(ctx, `SELECT * FROM no_such_table`)
	if err == nil || postgres.Unavailable(err) || postgres.Retryable(err) {
		t.Errorf("a statement's own error: %v; want neither Unavailable nor Retryable", err)
	}

	for _, code := range []string{"57P01", "08006", "53300"} {
		_, err = db.Pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '`+code+`'; END $$`)
		if !postgres.Unavailable(err) {
			t.Errorf("SQLSTATE %s: %v; want Unavailable", code, err)
		}
	}
	for _, code := range []string{"40P01", "40001"} {
		_, err = db.Pool.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '`+code+`'; END $$`)
		if !postgres.Retryable(err) || postgres.Unavailable(err) {
			t.Errorf("SQLSTATE %s: %v; want Retryable only", code, err)
		}
	}
}
