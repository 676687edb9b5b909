package vps

import (
	"context"
	"testing"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestMigrationsDownAndUp: the module's schema goes down whole and comes back.
func TestMigrationsDownAndUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	tables := func() int {
		return computetest.Count(t, db.Pool, `SELECT count(*) FROM pg_tables WHERE schemaname = 'compute' AND tablename LIKE 'vps\_%'`)
	}
	if err := postgres.Migrate(ctx, db, postgres.Core, Migrations); err != nil {
		t.Fatal(err)
	}
	up := tables()
	if err := postgres.MigrateDown(ctx, db, Migrations); err != nil {
		t.Fatal(err)
	}
	if n := tables(); up < 6 || n != 0 {
		t.Fatalf("%d vps tables up, %d after down; want all six, then none", up, n)
	}
	if err := postgres.Migrate(ctx, db, postgres.Core, Migrations); err != nil {
		t.Fatal(err)
	}
	if n := tables(); n != up {
		t.Fatalf("%d vps tables after down and up, want %d", n, up)
	}
}
