package computetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Querier is what Count reads with: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Count runs q, a query of one integer (a count(*)), and fails the test when it cannot.
func Count(t testing.TB, db Querier, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", q, err)
	}
	return n
}
