// Package postgres is Better Compute's store: the connection pool, the migrations every package
// and module owns, and compute_now(), the one clock all SQL reads.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvDatabaseURL names the environment variable that points Better Compute at an existing server.
const EnvDatabaseURL = "BETTER_COMPUTE_DATABASE_URL"

// DB is a connection pool to the database Better Compute keeps its truth in.
type DB struct {
	Pool *pgxpool.Pool

	// now is the test clock: when set, every connection handed out reads it as compute_now().
	now atomic.Pointer[time.Time]
}

// Querier is what a pool, a connection and a transaction have in common.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pool defaults, applied by Open when the URL does not set them (pool_max_conns=…).
const (
	// DefaultMaxConns is the pool size. pgx's own default is the number of CPUs (4 on a small
	// machine), which 40 concurrent API calls, the gateway's flushes and the workers exhaust;
	// PostgreSQL's default max_connections of 100 leaves room for two or three processes at 32.
	DefaultMaxConns = 32
	// DefaultMinConns connections are kept open, so that a burst does not wait on new ones.
	DefaultMinConns = 2
	// DefaultMaxConnIdleTime closes connections unused for this long.
	DefaultMaxConnIdleTime = 5 * time.Minute
	// DefaultHealthCheckPeriod is how often idle connections are checked, so that those a
	// server restart killed are replaced before a request is handed one.
	DefaultHealthCheckPeriod = 15 * time.Second
)

// Open connects to the database at url (a postgres:// URL or a key=value connection string) and
// checks that it answers. Pool settings the URL names (pool_max_conns, pool_min_conns, …) win
// over the Default… constants.
func Open(ctx context.Context, url string) (*DB, error) {
	if url == "" {
		return nil, errors.New("postgres: empty database URL; set " + EnvDatabaseURL + " or use postgres/embedded")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse database URL: %w", err)
	}
	set := func(name string) bool { return strings.Contains(url, name+"=") }
	if !set("pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	if !set("pool_min_conns") {
		cfg.MinConns = DefaultMinConns
	}
	if !set("pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = DefaultMaxConnIdleTime
	}
	if !set("pool_health_check_period") {
		cfg.HealthCheckPeriod = DefaultHealthCheckPeriod
	}
	return OpenConfig(ctx, cfg)
}

// OpenConfig is Open with a pool configuration the caller has tuned. A PrepareConn hook set by
// the caller still runs, after the clock's.
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*DB, error) {
	db := &DB{}
	prepare := cfg.PrepareConn
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if err := db.syncClock(ctx, c); err != nil {
			return false, err
		}
		if prepare != nil {
			return prepare(ctx, c)
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	db.Pool = pool
	return db, nil
}

// Close closes every connection of the pool.
func (db *DB) Close() { db.Pool.Close() }

// Tx runs fn in one transaction, committed when fn returns nil and rolled back otherwise.
func (db *DB) Tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db.Pool, fn)
}

// SetNow stops the clock at t for every statement run through this pool from now on: compute_now()
// returns t. It is for tests that travel in time; a connection already handed out keeps its clock
// until it is released.
func (db *DB) SetNow(t time.Time) { db.now.Store(&t) }

// ResetNow lets compute_now() follow the real clock again.
func (db *DB) ResetNow() { db.now.Store(&time.Time{}) }

const clockKey = "compute.now"

// syncClock sets the session's compute.now to the test clock, when it differs from what the
// connection already has. With the clock never set it costs one atomic load.
func (db *DB) syncClock(ctx context.Context, c *pgx.Conn) error {
	p := db.now.Load()
	if p == nil {
		return nil
	}
	want := ""
	if !p.IsZero() {
		want = p.UTC().Format(time.RFC3339Nano)
	}
	data := c.PgConn().CustomData()
	if have, _ := data[clockKey].(string); have == want {
		return nil
	}
	if _, err := c.Exec(ctx, "SELECT pg_catalog.set_config('compute.now', $1, false)", want); err != nil {
		return fmt.Errorf("postgres: set test clock: %w", err)
	}
	data[clockKey] = want
	return nil
}

// SQLSTATE codes that callers branch on.
const (
	UniqueViolation      = "23505"
	ForeignKeyViolation  = "23503"
	CheckViolation       = "23514"
	ExclusionViolation   = "23P01"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	LockNotAvailable     = "55P03" // NOWAIT found a row locked, or lock_timeout passed
)

// ErrorCode returns the SQLSTATE of err, or "" when err is not a PostgreSQL error.
func ErrorCode(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// Retryable reports a transaction the database refereed and undid (a deadlock or a
// serialization failure): nothing of it was written, and running it again is safe.
func Retryable(err error) bool {
	code := ErrorCode(err)
	return code == DeadlockDetected || code == SerializationFailure
}

// Unavailable reports an error that says the database could not be reached or went away (a
// failed connect, a connection cut, the server shutting down or out of connections), as
// opposed to one about the statement. Callers answer it as "try again", not as a bug.
func Unavailable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch {
		case strings.HasPrefix(pg.Code, "08"), // connection exception
			strings.HasPrefix(pg.Code, "53"),                           // insufficient resources: too many connections, out of memory
			pg.Code == "57P01", pg.Code == "57P02", pg.Code == "57P03": // admin or crash shutdown, starting up
			return true
		}
		return false
	}
	var connect *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connect) || errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Constraint returns the name of the constraint err violated, or "".
func Constraint(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.ConstraintName
	}
	return ""
}
