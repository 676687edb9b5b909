package computetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Rower is what LogRows reads with: a pool, a connection or a transaction.
type Rower interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// LogRows logs each row of q, a query of one text column, after prefix: what a failing test
// shows of the database to say why. An error is logged, not failed on: the test is failing
// already.
func LogRows(t testing.TB, db Rower, prefix, q string, args ...any) {
	t.Helper()
	rows, err := db.Query(context.Background(), q, args...)
	if err != nil {
		t.Logf("%s: %v", prefix, err)
		return
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, l := range lines {
		t.Logf("%s: %s", prefix, l)
	}
	if err != nil {
		t.Logf("%s: %v", prefix, err)
	}
}
