// Package jobs owns the durable job queue: River (github.com/riverqueue/river), its tables in
// the compute schema, and the one client a control plane enqueues with, in its callers'
// transactions, and works the jobs with in the worker mode. Work that must survive a crash and
// be retried (a webhook delivery, a workflow step) is a River job, not a loop of our own.
package jobs

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/better-compute/compute/postgres"
)

// Schema is where River's tables live: beside ours, so that a job and the rows it is about
// commit in one transaction.
const Schema = "compute"

// Migrations is River's schema (its "main" migration line) as a migration set of ours, applied
// with the others under the one migration lock. River supports a host's own migration system;
// each version is also recorded in River's river_migration table, so River's own tools agree.
func Migrations() (postgres.MigrationSet, error) {
	m, err := rivermigrate.New(riverpgxv5.New(nil), &rivermigrate.Config{Schema: Schema})
	if err != nil {
		return postgres.MigrationSet{}, fmt.Errorf("jobs: River's migrations: %w", err)
	}
	files := fstest.MapFS{}
	for _, v := range m.AllVersions() {
		record := fmt.Sprintf("INSERT INTO %[1]s.river_migration (line, version) VALUES ('main', %[2]d)", Schema, v.Version)
		unrecord := fmt.Sprintf("DELETE FROM %[1]s.river_migration WHERE line = 'main' AND version = %[2]d", Schema, v.Version)
		if v.Version < 5 { // before 005 the table had no line
			record = fmt.Sprintf("INSERT INTO %s.river_migration (version) VALUES (%d)", Schema, v.Version)
			unrecord = fmt.Sprintf("DELETE FROM %s.river_migration WHERE version = %d", Schema, v.Version)
		}
		up, down := render(v.SQLUp), render(v.SQLDown)
		if v.Version == 1 { // the table goes with the down of its own migration
			unrecord = "SELECT 1"
		}
		body := "-- +goose Up\n-- +goose StatementBegin\n" + up + "\n-- +goose StatementEnd\n" +
			"-- +goose StatementBegin\n" + record + "\n-- +goose StatementEnd\n" +
			"-- +goose Down\n-- +goose StatementBegin\n" + unrecord + "\n-- +goose StatementEnd\n" +
			"-- +goose StatementBegin\n" + down + "\n-- +goose StatementEnd\n"
		files[fmt.Sprintf("%05d_river_%s.sql", v.Version, strings.ReplaceAll(v.Name, " ", "_"))] = &fstest.MapFile{Data: []byte(body)}
	}
	return postgres.MigrationSet{Name: "river", Schema: Schema, FS: files}, nil
}

func render(sql string) string { return strings.ReplaceAll(sql, "/* TEMPLATE: schema */", Schema+".") }

// Queue is a named River queue and how many of its jobs one process works at once.
type Queue struct {
	Name       string
	MaxWorkers int
}

// Config configures a Client.
type Config struct {
	Pool    *pgxpool.Pool
	Logger  *slog.Logger // River's own lines below Warn are dropped
	Workers *river.Workers
	Queues  []Queue
	// JobTimeout bounds one attempt of a job whose worker sets no timeout of its own. Default 1 min.
	JobTimeout time.Duration
	// RescueAfter is when a running job whose process died is worked again: it must exceed every
	// worker's timeout, or a slow attempt would be run twice at once. Default JobTimeout + 1 min.
	RescueAfter time.Duration
	// Periodic are jobs the leader inserts on a schedule (river.NewPeriodicJob), once the client runs.
	Periodic []*river.PeriodicJob
}

// Client enqueues jobs and, once Run, works them.
type Client struct {
	river *river.Client[pgx.Tx]
	works bool
}

// New builds the client; it touches neither the database nor the network.
func New(cfg Config) (*Client, error) {
	if cfg.Pool == nil {
		return nil, errors.New("jobs: no database pool")
	}
	if cfg.Workers == nil {
		cfg.Workers = river.NewWorkers()
	}
	if cfg.JobTimeout == 0 {
		cfg.JobTimeout = time.Minute
		if cfg.RescueAfter > 0 {
			cfg.JobTimeout = min(cfg.JobTimeout, cfg.RescueAfter/2)
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	rc := &river.Config{
		Schema:     Schema,
		Logger:     slog.New(warnings{logger.Handler()}),
		Workers:    cfg.Workers,
		JobTimeout: cfg.JobTimeout,
		// A job whose process died mid-attempt is rescued once no live attempt could still be
		// running it.
		RescueStuckJobsAfter: cmp.Or(cfg.RescueAfter, cfg.JobTimeout+time.Minute),
		PeriodicJobs:         cfg.Periodic,
	}
	if len(cfg.Queues) > 0 {
		rc.Queues = map[string]river.QueueConfig{}
		for _, q := range cfg.Queues {
			if q.Name == "" || q.MaxWorkers < 1 {
				return nil, fmt.Errorf("jobs: queue %q: a queue needs a name and at least one worker", q.Name)
			}
			if _, dup := rc.Queues[q.Name]; dup {
				return nil, fmt.Errorf("jobs: queue %q declared twice", q.Name)
			}
			rc.Queues[q.Name] = river.QueueConfig{MaxWorkers: q.MaxWorkers}
		}
	}
	c, err := river.NewClient(riverpgxv5.New(cfg.Pool), rc)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	return &Client{river: c, works: len(cfg.Queues) > 0}, nil
}

// InsertTx enqueues a job in tx (it exists exactly when tx commits) and returns its id.
func (c *Client) InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (int64, error) {
	res, err := c.river.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return 0, fmt.Errorf("jobs: enqueue %s: %w", args.Kind(), err)
	}
	return res.Job.ID, nil
}

// CancelTx cancels job id in tx: a queued job is never worked; a running one has its context
// cancelled (through River's notifications, on whichever process runs it) once tx commits.
func (c *Client) CancelTx(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := c.river.JobCancelTx(ctx, tx, id); err != nil && !errors.Is(err, river.ErrNotFound) {
		return fmt.Errorf("jobs: cancel job %d: %w", id, err)
	}
	return nil
}

// Backoff is the delay after a job's attempt-th failed attempt: base doubled per attempt up to
// ceiling, times a jitter in [0.8, 1.2) that is the job's own (a hash of its id and the attempt, not
// a draw), so that a worker that records the next attempt and River's NextRetry agree, and a
// burst of failures does not retry in step.
func Backoff(base, ceiling time.Duration, jobID int64, attempt int) time.Duration {
	d := ceiling
	if attempt <= 30 {
		d = min(base<<max(attempt-1, 0), ceiling)
	}
	h := fnv.New64a()
	_ = binary.Write(h, binary.LittleEndian, [2]int64{jobID, int64(attempt)})
	return time.Duration(float64(d) * (0.8 + 0.4*float64(h.Sum64()%1000)/1000))
}

// InsertManyTx enqueues jobs in tx, in one statement.
func (c *Client) InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) error {
	if len(params) == 0 {
		return nil
	}
	if _, err := c.river.InsertManyFastTx(ctx, tx, params); err != nil {
		return fmt.Errorf("jobs: enqueue %d jobs: %w", len(params), err)
	}
	return nil
}

// Run works the queues until ctx ends, then stops, letting running attempts finish for up to
// 10 seconds (River resumes what it cut on another process). A client without queues only
// enqueues; Run then waits for ctx.
func (c *Client) Run(ctx context.Context) error {
	if !c.works {
		<-ctx.Done()
		return nil
	}
	// Started apart from ctx, so that its end is a graceful stop, not River's hard one.
	if err := c.river.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("jobs: start: %w", err)
	}
	<-ctx.Done()
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := c.river.Stop(stop); err != nil {
		// Attempts still running are cut; River retries them.
		return c.river.StopAndCancel(context.WithoutCancel(ctx))
	}
	return nil
}

// warnings passes River's warnings and errors to the control plane's log, not its routine
// lines (a queue started, a leader elected).
type warnings struct{ slog.Handler }

func (w warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && w.Handler.Enabled(ctx, l)
}

func (w warnings) WithAttrs(as []slog.Attr) slog.Handler { return warnings{w.Handler.WithAttrs(as)} }
func (w warnings) WithGroup(name string) slog.Handler    { return warnings{w.Handler.WithGroup(name)} }
