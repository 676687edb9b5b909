package computetest_test

import (
	"fmt"
	"testing"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestLogRowsLogsEachRow: every row of the query is logged after the prefix, and a bad query
// is logged rather than failing the test.
func TestLogRowsLogsEachRow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rec := &logRecorder{TB: t}
	computetest.LogRows(rec, db.Pool, "row", `SELECT format('n=%s', i) FROM generate_series(1, 2) i`)
	computetest.LogRows(rec, db.Pool, "bad", `SELECT nope`)
	if len(rec.lines) != 3 || rec.lines[0] != "row: n=1" || rec.lines[1] != "row: n=2" || rec.lines[2][:5] != "bad: " {
		t.Fatalf("logged %q", rec.lines)
	}
}

type logRecorder struct {
	testing.TB
	lines []string
}

func (r *logRecorder) Helper() {}
func (r *logRecorder) Logf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}
