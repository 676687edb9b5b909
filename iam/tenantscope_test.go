package iam_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestContractActsOnlyInTheCallersTenants: a service of organization A, allowed every iam:*
// call in A, names its sibling B and its parent (the root) on every route of the contract. Each
// is refused, as not found where a tenant is named (like a tenant that does not exist), and
// nothing is done there; A's own project is served.
func TestContractActsOnlyInTheCallersTenants(t *testing.T) {
	t.Parallel()
	defer failed(t)
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	a := must(iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1}))
	check(t, a.Initialize(ctx))
	must(a.CreateTenant(ctx, iam.CreateTenant{ID: "org-a", ParentID: "root"}))
	must(a.CreateTenant(ctx, iam.CreateTenant{ID: "org-b", ParentID: "root"}))
	must(a.CreateTenant(ctx, iam.CreateTenant{ID: "proj-a", ParentID: "org-a"}))
	check(t, a.EnsureMeters(ctx, []iam.Meter{{Key: "gpu.h100.hours", Unit: "hour"}}))
	check(t, a.SetFlag(ctx, "compute.spot", false, ""))
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	svc := must(a.CreateAdminKey(ctx, "org-a", "svc-a"))
	r := must(iam.Remote(srv.URL, svc.Token, iam.RemoteOptions{Retries: -1, RegisterCatalog: true}))

	// Identities: a bot with a role and a delegation in A, and the same in B.
	bots := map[string]iam.Principal{}
	for _, ten := range []string{"org-a", "org-b"} {
		ada := must(a.CreateIdentity(ctx, ten, iam.KindUser, "ada"))
		bot := must(a.CreateIdentity(ctx, ten, iam.KindAgent, "bot"))
		role := must(a.CreateRole(ctx, ten, "pools", allow("compute:pools:*")))
		check(t, a.Bind(ctx, bot.ID, role.ID, ten))
		must(a.CreateDelegation(ctx, ten, ada.ID, bot.ID, []string{"compute:pools:delete"}))
		key := must(a.CreateAPIKey(ctx, bot.ID, "", time.Time{}))
		bots[ten] = must(a.Authenticate(ctx, key.Token))
	}
	botA, botB := bots["org-a"], bots["org-b"]
	notFound := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, iam.ErrNotFound) {
			t.Errorf("%s = %v, want not found", what, err)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		var re interface{ Unwrap() error }
		if err == nil || !errors.As(err, &re) || errors.Is(err, iam.ErrNotFound) {
			t.Errorf("%s = %v, want access denied", what, err)
		}
	}
	others := []string{"org-b", "root"} // a sibling and a parent

	// authorize
	if d := must(r.Authorize(ctx, botA, pool("proj-a", "compute:pools:list"))); !d.Allowed {
		t.Errorf("a decision in A's project = %+v", d)
	}
	for _, ten := range others {
		if d := must(r.Authorize(ctx, botA, pool(ten, "compute:pools:list"))); d.Allowed {
			t.Errorf("a decision in %s = %+v", ten, d)
		}
		ds := must(r.AuthorizeMany(ctx, botA, []iam.Request{pool("org-a", "compute:pools:list"), pool(ten, "compute:pools:list")}))
		if !ds[0].Allowed || ds[1].Allowed {
			t.Errorf("decisions in A and %s = %+v", ten, ds)
		}
	}
	_, err := r.Authorize(ctx, botB, pool("org-b", "compute:pools:list"))
	refused("a decision for B's identity", err)
	_, err = r.AuthorizeMany(ctx, botB, []iam.Request{pool("org-b", "compute:pools:list")})
	refused("decisions for B's identity", err)

	// tenants/path
	if p := must(r.TenantPath(ctx, "proj-a")); !slices.Equal(p, []string{"proj-a", "org-a", "root"}) {
		t.Errorf("A's project's path = %v", p)
	}
	for _, ten := range append(others, "no-such-tenant") {
		if p := must(r.TenantPath(ctx, ten)); len(p) != 0 {
			t.Errorf("the path of %s = %v, want none", ten, p)
		}
	}

	// catalog: shared by every tenant, changed only from the root
	refused("catalog/register", r.RegisterCatalog(context.Background(), iam.Catalog{Actions: []iam.Action{{Name: "x:y:z", ResourceType: "x"}}}))
	if c := must(a.Catalog(ctx)); len(c.Actions) != 0 {
		t.Errorf("the catalog after A's register = %+v", c)
	}

	// billing
	refused("billing/ensureMeters", r.EnsureMeters(ctx, []iam.Meter{{Key: "gpu.evil.hours", Unit: "hour"}}))
	usage := func(tenant, key string) iam.Usage {
		return iam.Usage{TenantID: tenant, Meter: "gpu.h100.hours", Quantity: 1, OccurredAt: time.Now(), IdempotencyKey: key}
	}
	must(r.RecordUsage(ctx, usage("proj-a", "u-a")))
	for _, ten := range others {
		_, err := r.RecordUsage(ctx, usage(ten, "u-"+ten))
		notFound("billing/record in "+ten, err)
		if total, n := must2f(a.UsageTotal(ctx, ten, "gpu.h100.hours")); n != 0 {
			t.Errorf("%s was billed %v", ten, total)
		}
	}
	// A key another tenant used shows A nothing of that tenant's receipt.
	first := must(a.RecordUsage(ctx, usage("org-b", "shared-key")))
	if rc, err := r.RecordUsage(ctx, usage("org-a", "shared-key")); err == nil && rc.ID == first.ID {
		t.Errorf("A's usage under B's key answered B's receipt %+v", rc)
	}

	// flags
	if _, err := r.Flag(ctx, "proj-a", "compute.spot"); err != nil {
		t.Errorf("a flag of A's project: %v", err)
	}
	for _, ten := range append(others, "no-such-tenant") {
		_, err := r.Flag(ctx, ten, "compute.spot")
		notFound("flags/evaluate in "+ten, err)
	}

	// confirmations
	del := pool("org-a", "compute:pools:delete")
	del.Method, del.Input = "pools.delete", json.RawMessage(`{"pool":"p1"}`)
	cA := must(r.RequestConfirmation(ctx, botA, del))
	if got := must(r.Confirmation(ctx, cA.ID)); got.ID != cA.ID {
		t.Errorf("A's confirmation = %+v", got)
	}
	for _, ten := range others {
		d := pool(ten, "compute:pools:delete")
		_, err := r.RequestConfirmation(ctx, botA, d)
		notFound("a confirmation in "+ten, err)
	}
	delB := pool("org-b", "compute:pools:delete")
	_, err = r.RequestConfirmation(ctx, botB, delB)
	refused("a confirmation for B's identity", err)
	cB := must(a.RequestConfirmation(ctx, botB, delB))
	_, err = r.Confirmation(ctx, cB.ID)
	notFound("B's confirmation", err)

	// events: A's and its project's, never B's or the root's
	_, cursor := must2(t)(r.Events(ctx, -1, 0))
	must(a.CreateTenant(ctx, iam.CreateTenant{ID: "proj-b", ParentID: "org-b"}))
	check(t, a.OverrideFlag(ctx, "compute.spot", "root", true))
	must(a.CreateTenant(ctx, iam.CreateTenant{ID: "proj-a2", ParentID: "org-a"}))
	check(t, a.DeleteTenant(ctx, "proj-b"))
	evs, next := must2(t)(r.Events(ctx, cursor, 0))
	if len(evs) != 1 || evs[0].TenantID != "proj-a2" || next <= cursor {
		t.Errorf("A's events = %+v (next %d after %d), want proj-a2's creation only", evs, next, cursor)
	}
	if all, _ := must2(t)(a.Events(ctx, cursor, 0)); len(all) != 4 {
		t.Errorf("the root sees %d events, want 4", len(all))
	}
}

func must2f(total float64, n int, err error) (float64, int) {
	if err != nil {
		panic(failure{err})
	}
	return total, n
}
