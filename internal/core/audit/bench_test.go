package audit_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/audit"
	"github.com/better-compute/compute/internal/core/events"
)

// benchLog is a log of n sequenced events of a typical size (a reservation's data).
func benchLog(b *testing.B, n int) *computetest.Env {
	env := computetest.New(b, computetest.Options{})
	ctx := context.Background()
	if _, err := env.DB.Pool.Exec(ctx, `INSERT INTO compute.events (type, tenant_id, subject, data)
		SELECT 'reservation.created', 'tenant-' || (i % 50), gen_random_uuid()::text,
		       jsonb_build_object('pool', 'h100', 'gpus', i % 8 + 1, 'model', 'h100', 'end', now()::text)
		FROM generate_series(1, $1) i`, n); err != nil {
		b.Fatal(err)
	}
	for {
		placed, err := events.Sequence(ctx, env.DB)
		if err != nil {
			b.Fatal(err)
		}
		if placed == 0 {
			break
		}
	}
	if _, err := env.DB.Pool.Exec(ctx, `ANALYZE compute.events`); err != nil {
		b.Fatal(err)
	}
	return env
}

// BenchmarkProveFrom100k: an inclusion proof of the last of 100,000 events, computed from the
// live rows, as audit verify asks for (its cost is a pass over the whole log).
//
//	go test ./internal/core/audit -run '^$' -bench ProveFrom100k -benchtime 5x
func BenchmarkProveFrom100k(b *testing.B) {
	const n = 100_000
	env := benchLog(b, n)
	ctx := context.Background()
	for b.Loop() {
		if _, _, err := audit.Inclusion(ctx, env.DB.Pool, n, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/event")
}

// BenchmarkPublish100k: the publisher's checkpoint of 100,000 new events (one batch).
//
//	go test ./internal/core/audit -run '^$' -bench Publish100k -benchtime 5x
func BenchmarkPublish100k(b *testing.B) {
	const n = 100_000
	env := benchLog(b, n)
	ctx := context.Background()
	key, err := audit.NewKey(computetest.Secret)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		if _, err := env.DB.Pool.Exec(ctx, `DELETE FROM compute.audit_checkpoints`); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cp, _, err := audit.Publish(ctx, env.DB, key)
		if err != nil || cp == nil || cp.Size != n {
			b.Fatalf("%+v %v", cp, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/event")
}
