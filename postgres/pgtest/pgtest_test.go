package pgtest_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestDatabasesAreIsolatedAndMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := pgtest.New(t, postgres.Core)
	b := pgtest.New(t, postgres.Core)
	if _, err := a.Pool.Exec(ctx, "CREATE TABLE compute.only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := b.Pool.QueryRow(ctx, "SELECT to_regclass('compute.only_in_a') IS NOT NULL").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("a table created in one test database is visible in another")
	}
	var super bool
	if err := b.Pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Fatal("tests connect as a superuser; they must connect as an application would")
	}
}

// BenchmarkNew measures how long a test waits for its database.
func BenchmarkNew(b *testing.B) {
	pgtest.New(b, postgres.Core) // the template, once
	for b.Loop() {
		pgtest.New(b, postgres.Core)
	}
}
