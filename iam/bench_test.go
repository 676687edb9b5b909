package iam_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// BenchmarkDecisions measures the embedded port's decisions, printing decisions/s and p99:
// uncached (every decision reads the identity's policies and the tenant path from PostgreSQL),
// with the embedded port's policy cache (the default), and answered by Better Compute's read
// decision cache in front of it. The caller is bound at an organization and decides in a project
// under it, with three roles of four statements each, one with a condition.
func BenchmarkDecisions(b *testing.B) {
	db := pgtest.New(b, postgres.Core, iam.Migrations)
	ctx := context.Background()
	admin, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"})
	if err != nil {
		b.Fatal(err)
	}
	if err := admin.Initialize(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.CreateTenant(ctx, iam.CreateTenant{ID: "org", ParentID: "root"}); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.CreateTenant(ctx, iam.CreateTenant{ID: "proj", ParentID: "org"}); err != nil {
		b.Fatal(err)
	}
	svc, err := admin.CreateIdentity(ctx, "org", iam.KindService, "ops")
	if err != nil {
		b.Fatal(err)
	}
	for _, group := range []string{"sites", "pools", "reservations"} {
		role, err := admin.CreateRole(ctx, "org", group, iam.Policy{Version: 1, Statements: []iam.Statement{
			{Effect: iam.Allow, Actions: []string{"compute:" + group + ":get", "compute:" + group + ":list"}, Resources: []string{"*"}},
			{Effect: iam.Allow, Actions: []string{"compute:" + group + ":create"}, Resources: []string{"*"}},
			{Effect: iam.Deny, Actions: []string{"compute:" + group + ":delete"}, Resources: []string{"compute-pool/prod-*"}},
			{Effect: iam.Allow, Actions: []string{"compute:" + group + ":update"}, Resources: []string{"*"},
				Conditions: map[string]any{"StringEquals": map[string]any{"principal.kind": "service"}}},
		}})
		if err != nil {
			b.Fatal(err)
		}
		if err := admin.Bind(ctx, svc.ID, role.ID, "org"); err != nil {
			b.Fatal(err)
		}
	}
	key, err := admin.CreateAPIKey(ctx, svc.ID, "", time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	req := iam.Request{TenantID: "proj", Action: "compute:reservations:list", Resource: iam.Resource{Type: "compute-reservation", ID: "*"}}

	uncached, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1})
	if err != nil {
		b.Fatal(err)
	}
	p, err := uncached.Authenticate(ctx, key.Token)
	if err != nil {
		b.Fatal(err)
	}
	decide := func(port iam.Port) func() error {
		return func() error {
			d, err := port.Authorize(ctx, p, req)
			if err == nil && !d.Allowed {
				b.Fatalf("denied: %+v", d)
			}
			return err
		}
	}
	reads := iam.NewDecisionCache(time.Hour, 100_000)
	b.Run("uncached", func(b *testing.B) { runDecisions(b, decide(uncached)) })
	b.Run("policy-cache", func(b *testing.B) { runDecisions(b, decide(admin)) })
	b.Run("decision-cache", func(b *testing.B) {
		runDecisions(b, func() error {
			if _, ok := reads.Get(p, req); ok {
				return nil
			}
			d, err := admin.Authorize(ctx, p, req)
			reads.Put(p, req, d)
			return err
		})
	})
}

// runDecisions runs fn from parallel goroutines and reports throughput and the p99 latency.
func runDecisions(b *testing.B, fn func() error) {
	var mu sync.Mutex
	var all []time.Duration
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t := time.Now()
			if err := fn(); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t))
		}
		mu.Lock()
		all = append(all, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds())/1e3, "p99-µs")
}
