// Package pgtest gives every test its own fresh, migrated PostgreSQL database: one server per
// test binary (postgres/embedded, or the server BETTER_COMPUTE_DATABASE_URL names), one template
// database per distinct list of migration sets, and a clone of it per test.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		db := pgtest.New(t, postgres.Core, fleet.Migrations)
//		...
//	}
//
// Clones are made with CREATE DATABASE … STRATEGY FILE_COPY, about 20 ms for a small schema on
// PostgreSQL 15, where the default WAL_LOG strategy (which pgtestdb uses) takes over 100 ms. Tests
// connect as a role without superuser rights, as an application would, and each test database's
// search_path is empty, so a query that forgets its schema fails in tests rather than in production.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/embedded"
)

// Role is the role tests connect as: it owns the test databases, and has no superuser rights.
const Role = "compute_test"

var (
	mainCalled bool

	startOnce  sync.Once
	serverURL  string
	admin      *pgxpool.Pool
	stopServer func(context.Context) error
	startErr   error

	templatesMu sync.Mutex
	templates   = map[string]*template{}
)

type template struct {
	once sync.Once
	name string
	err  error
}

// Main runs the test binary's tests, stops the server New started and then fails the binary if
// any goroutine is left running: every goroutine needs an owner that stops it. Call it from
// TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main that returns the exit code instead of exiting, for a TestMain that has its own
// things to remove after the tests (what it built once for all of them).
func Run(m *testing.M) int {
	mainCalled = true
	code := m.Run()
	if admin != nil {
		admin.Close()
	}
	if stopServer != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := stopServer(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		cancel()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines left running after the tests:", err)
			code = 1
		}
	}
	return code
}

// ServerURL returns the URL of the test binary's server, as a superuser, starting it on first use.
func ServerURL(t testing.TB) string {
	t.Helper()
	if !mainCalled {
		t.Fatal("pgtest: call pgtest.Main(m) from TestMain, so that the test server is stopped when the tests end")
	}
	startOnce.Do(func() { startErr = start() })
	if startErr != nil {
		t.Fatalf("pgtest: start the test database server: %v", startErr)
	}
	return serverURL
}

func start() error {
	ctx := context.Background()
	var err error
	serverURL, stopServer, err = embedded.Server(ctx, embedded.Options{})
	if err != nil {
		return err
	}
	admin, err = pgxpool.New(ctx, serverURL)
	if err != nil {
		return err
	}
	// Several test binaries may share a server named by the environment: create the role once.
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		PERFORM pg_advisory_lock(hashtext('pgtest role'));
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+Role+`') THEN
			CREATE ROLE `+Role+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
		END IF;
		PERFORM pg_advisory_unlock(hashtext('pgtest role'));
	END $$`)
	if err != nil {
		return err
	}
	// A server that needs passwords (the embedded one does) gets the role the superuser's: the
	// test binaries that share a server then agree on it.
	if u, perr := url.Parse(serverURL); perr == nil {
		if pw, ok := u.User.Password(); ok {
			var stmt string
			if err := admin.QueryRow(ctx, `SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text)`, Role, pw).Scan(&stmt); err != nil {
				return err
			}
			_, err = admin.Exec(ctx, stmt)
		}
	}
	return err
}

// URL returns the connection URL of a new database migrated with sets. The database is dropped
// when the test ends, and kept when the test fails, to look at.
func URL(t testing.TB, sets ...postgres.MigrationSet) string {
	t.Helper()
	ServerURL(t)
	ctx := context.Background()
	tpl, err := templateFor(ctx, sets)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	name := tpl + "_" + random()
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s OWNER %s STRATEGY FILE_COPY", name, tpl, Role)); err != nil {
		t.Fatalf("pgtest: clone %s: %v", tpl, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: kept the database of this failed test: %s", dbURL(name))
			return
		}
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	return dbURL(name)
}

// New returns a pool on a new database migrated with sets, closed when the test ends.
func New(t testing.TB, sets ...postgres.MigrationSet) *postgres.DB {
	t.Helper()
	return Open(t, URL(t, sets...))
}

// Open opens a pool on a database URL the way New does (empty search_path), closed when the test ends.
func Open(t testing.TB, dbURL string) *postgres.DB {
	t.Helper()
	db, err := open(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(db.Close)
	return db
}

func open(ctx context.Context, dbURL string) (*postgres.DB, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = 16
	return postgres.OpenConfig(ctx, cfg)
}

// dbURL is the URL of database name on the test server, as Role.
func dbURL(name string) string {
	u, _ := url.Parse(serverURL)
	if pw, ok := u.User.Password(); ok {
		u.User = url.UserPassword(Role, pw)
	} else {
		u.User = url.User(Role)
	}
	u.Path = "/" + name
	return u.String()
}

// templateFor returns the name of the template database for sets, building it on first use.
// Other processes sharing the server wait on an advisory lock while one builds it.
func templateFor(ctx context.Context, sets []postgres.MigrationSet) (string, error) {
	hash, err := postgres.Hash(sets...)
	if err != nil {
		return "", err
	}
	templatesMu.Lock()
	tpl, ok := templates[hash]
	if !ok {
		tpl = &template{name: "pgtest_" + hash[:16]}
		templates[hash] = tpl
	}
	templatesMu.Unlock()
	tpl.once.Do(func() { tpl.err = build(ctx, tpl.name, sets) })
	return tpl.name, tpl.err
}

func build(ctx context.Context, name string, sets []postgres.MigrationSet) error {
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", name)
	var done bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&done)
	if err != nil || done {
		return err
	}
	// A template that is not marked done is what a crashed build left: start again.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s OWNER %s", name, Role)); err != nil {
		return fmt.Errorf("create template %s: %w", name, err)
	}
	db, err := open(ctx, dbURL(name))
	if err != nil {
		return err
	}
	err = postgres.Migrate(ctx, db, sets...)
	db.Close()
	if err != nil {
		return fmt.Errorf("migrate template %s: %w", name, err)
	}
	_, err = conn.Exec(ctx, "UPDATE pg_database SET datistemplate = true WHERE datname = $1", name)
	return err
}

func random() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
