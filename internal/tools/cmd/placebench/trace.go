package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

var trace *bool

// statementTracer sums the time spent in each statement, by its first words.
type statementTracer struct {
	mu    sync.Mutex
	total map[string]time.Duration
	count map[string]int
}

var tracer = &statementTracer{total: map[string]time.Duration{}, count: map[string]int{}}

type traceKey struct{}

type started struct {
	sql string
	at  time.Time
}

func (t *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceKey{}, started{d.SQL, time.Now()})
}

func (t *statementTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(started)
	if !ok {
		return
	}
	k := strings.Join(strings.Fields(s.sql), " ")
	if len(k) > 90 {
		k = k[:90]
	}
	t.mu.Lock()
	t.total[k] += time.Since(s.at)
	t.count[k]++
	t.mu.Unlock()
}

func (t *statementTracer) report(ops int) {
	type row struct {
		k string
		d time.Duration
		n int
	}
	var rows []row
	for k, d := range t.total {
		rows = append(rows, row{k, d, t.count[k]})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].d > rows[j].d })
	for _, r := range rows[:min(25, len(rows))] {
		fmt.Fprintf(os.Stderr, "%8.3f ms/op %6d× %s\n", float64(r.d.Microseconds())/1000/float64(ops), r.n, r.k)
	}
}
