package jobs_test

import (
	"context"
	"errors"
	"io/fs"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/jobs"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type countArgs struct {
	N int `json:"n"`
}

func (countArgs) Kind() string { return "test.count" }

// flaky fails each job's first attempt, then counts it.
type flaky struct {
	river.WorkerDefaults[countArgs]
	worked atomic.Int64
	failed atomic.Int64
}

func (w *flaky) Work(ctx context.Context, j *river.Job[countArgs]) error {
	if j.Attempt == 1 {
		w.failed.Add(1)
		return errors.New("the first attempt fails")
	}
	w.worked.Add(int64(j.Args.N))
	return nil
}

func (w *flaky) NextRetry(*river.Job[countArgs]) time.Time {
	return time.Now().Add(10 * time.Millisecond)
}

func migrations(t *testing.T) []postgres.MigrationSet {
	t.Helper()
	river, err := jobs.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	return []postgres.MigrationSet{postgres.Core, river}
}

// TestCommittedJobsAreWorkedAndRetriedRolledBackOnesNever enqueues jobs in transactions that
// commit and one that rolls back, and works them with a job whose first attempt fails.
func TestCommittedJobsAreWorkedAndRetriedRolledBackOnesNever(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, migrations(t)...)
	w := &flaky{}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	c, err := jobs.New(jobs.Config{Pool: db.Pool, Workers: workers, Queues: []jobs.Queue{{Name: river.QueueDefault, MaxWorkers: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(n int, commit bool) {
		t.Helper()
		err := db.Tx(ctx, func(tx pgx.Tx) error {
			params := []river.InsertManyParams{{Args: countArgs{N: n}}, {Args: countArgs{N: n}}}
			if err := c.InsertManyTx(ctx, tx, params); err != nil {
				return err
			}
			if !commit {
				return errors.New("roll back")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
	}
	enqueue(1, true)
	enqueue(100, false)
	if err := db.Tx(ctx, func(tx pgx.Tx) error { _, err := c.InsertTx(ctx, tx, countArgs{N: 10}, nil); return err }); err != nil {
		t.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	computetest.Eventually(t, 20*time.Second, "12 jobs worked", func() bool { return w.worked.Load() >= 12 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := w.worked.Load(); got != 12 {
		t.Errorf("worked %d, want 12: the three committed jobs, each once, and none of the rolled-back two", got)
	}
	if got := w.failed.Load(); got != 3 {
		t.Errorf("%d first attempts failed, want 3", got)
	}
}

// TestRiverMigrationsRecordTheirVersionsAndRollBack applies River's schema as a set of ours,
// checks that River's own table agrees, and rolls it back.
func TestRiverMigrationsRecordTheirVersionsAndRollBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sets := migrations(t)
	db := pgtest.New(t, sets...)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.river_migration WHERE line = 'main'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(sets[1].FS, "*.sql")
	if err != nil || len(files) < 8 {
		t.Fatalf("River's migration set has %d files (%v), want its whole main line", len(files), err)
	}
	if n != len(files) {
		t.Errorf("river_migration records %d versions of the main line, want %d: every one applied", n, len(files))
	}
	if err := postgres.MigrateDown(ctx, db, sets[1]); err != nil {
		t.Fatalf("roll River's schema back: %v", err)
	}
	var exists bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('compute.river_job') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Errorf("after the rollback river_job exists: %v (%v)", exists, err)
	}
}
