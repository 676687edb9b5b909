package compute_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres/pgtest"
	"github.com/better-compute/compute/vps"
)

// TestRefereesServeNoQuery: every exclusion constraint of the schema, the core's and every
// module's, is partial on a column named guarded that every row has true, so that no query's
// plan can scan its index. PostgreSQL's GiST scans that a statement rescans can mark a live entry
// dead, and an exclusion check then skips it; a scan that is not rescanned, as every exclusion
// check's is, cannot (docs/capacity.md, "The referee's own index";
// internal/core/capacity's TestExclusionSurvivesGiSTRescans shows it).
func TestRefereesServeNoQuery(t *testing.T) {
	t.Parallel()
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := vps.New(vps.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sets, err := compute.MigrationSets(m, v)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t, append(sets, iam.Migrations)...)
	type referee struct {
		Table, Name, Predicate string
		Guarded                bool // the column is NOT NULL, true by default and checked true
	}
	rows, err := db.Pool.Query(context.Background(), `SELECT c.conrelid::regclass::text, c.conname::text, coalesce(pg_get_expr(i.indpred, i.indrelid), ''),
		  EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.conrelid AND a.attname = 'guarded' AND a.attnotnull
		    AND pg_get_expr((SELECT d.adbin FROM pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum), a.attrelid) = 'true'
		    AND EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.conrelid AND k.contype = 'c' AND pg_get_constraintdef(k.oid) = 'CHECK (guarded)'))
		FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid
		WHERE c.contype = 'x' ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[referee])
	if err != nil {
		t.Fatal(err)
	}
	// bookings, metal_leases, and vps's six: fewer means the query found nothing it should.
	if len(refs) < 8 {
		t.Fatalf("found %d exclusion constraints, want at least 8: %v", len(refs), refs)
	}
	for _, r := range refs {
		if r.Predicate != "guarded" || !r.Guarded {
			t.Errorf("%s's exclusion constraint %s has the predicate %q (guarded column checked: %v); want WHERE (guarded) on a column NOT NULL DEFAULT true CHECK (guarded)",
				r.Table, r.Name, r.Predicate, r.Guarded)
		}
	}
}
