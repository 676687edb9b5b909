package iam_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newLocal(t *testing.T) (*iam.Local, *postgres.DB) {
	t.Helper()
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	// These tests travel in time, which a cache keyed to the wall clock would not see.
	l, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Initialize(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l, db
}

func TestEmbeddedOptions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := iam.Embedded(nil, iam.EmbeddedOptions{RootTenantID: "r"}); err == nil {
		t.Error("nil db accepted")
	}
	if _, err := iam.Embedded(db, iam.EmbeddedOptions{}); err == nil {
		t.Error("empty RootTenantID accepted")
	}
	if _, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "no spaces"}); err == nil {
		t.Error("invalid RootTenantID accepted")
	}
}

func TestInitializeRefusesAnotherRoot(t *testing.T) {
	t.Parallel()
	l, db := newLocal(t)
	_ = l
	other, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "other-root"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Initialize(context.Background()); err == nil {
		t.Fatal("a second root tenant was accepted")
	}
}

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	l, db := newLocal(t)
	ctx := context.Background()
	user, err := l.CreateIdentity(ctx, "root", iam.KindUser, "ada")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateAPIKey(ctx, user.ID, "", time.Time{}); err == nil {
		t.Fatal("a user was given an API key")
	}
	svc, err := l.CreateIdentity(ctx, "root", iam.KindService, "billing")
	if err != nil {
		t.Fatal(err)
	}
	key, err := l.CreateAPIKey(ctx, svc.ID, "ci", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Authenticate(ctx, key.Token)
	if err != nil || p.ID != svc.ID || p.TenantID != "root" || p.KeyID != key.ID {
		t.Fatalf("Authenticate = %+v, %v", p, err)
	}
	var stored []byte
	if err := db.Pool.QueryRow(ctx, "SELECT token_hash FROM iam.api_keys WHERE id = $1", key.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if string(stored) == key.Token {
		t.Fatal("the token is stored in the clear")
	}

	// Expiry follows compute_now().
	db.SetNow(time.Now().Add(2 * time.Hour))
	if _, err := l.Authenticate(ctx, key.Token); !errors.Is(err, iam.ErrUnauthenticated) {
		t.Fatalf("an expired key authenticated: %v", err)
	}
	db.ResetNow()
	if err := l.RevokeAPIKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Authenticate(ctx, key.Token); !errors.Is(err, iam.ErrUnauthenticated) {
		t.Fatalf("a revoked key authenticated: %v", err)
	}
	if err := l.RevokeAPIKey(ctx, "key_nope"); !errors.Is(err, iam.ErrNotFound) {
		t.Fatalf("revoking a missing key = %v, want ErrNotFound", err)
	}
}

func TestBindingsFollowTheTenantTree(t *testing.T) {
	t.Parallel()
	l, _ := newLocal(t)
	ctx := context.Background()
	org, err := l.CreateTenant(ctx, iam.CreateTenant{ID: "acme", ParentID: "root"})
	if err != nil || org.Kind != "organization" {
		t.Fatalf("org = %+v, %v", org, err)
	}
	proj, err := l.CreateTenant(ctx, iam.CreateTenant{ID: "acme-ml", ParentID: "acme"})
	if err != nil || proj.Kind != "project" {
		t.Fatalf("project = %+v, %v", proj, err)
	}
	key, err := l.CreateAdminKey(ctx, "acme", "acme-ops")
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Authenticate(ctx, key.Token)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(tenant string) bool {
		d, err := l.Authorize(ctx, p, iam.Request{TenantID: tenant, Action: "compute:pools:create", Resource: iam.Resource{Type: "compute-pool", ID: "*"}})
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	if !ask("acme") || !ask("acme-ml") {
		t.Fatal("a binding in acme does not reach acme and its project")
	}
	if ask("root") {
		t.Fatal("a binding in acme reaches its parent")
	}
	for tenant, want := range map[string]bool{"acme-ml": true, "acme": true, "root": false} {
		if got, err := iam.TenantWithin(ctx, l, tenant, "acme"); err != nil || got != want {
			t.Errorf("TenantWithin(%s, acme) = %v, %v; want %v", tenant, got, err, want)
		}
	}
	if got, _ := iam.TenantWithin(ctx, l, "nope", "nope"); got {
		t.Error("a missing tenant is within itself")
	}
}

// TestCacheIsClearedByChanges checks that the caches never outlive a revocation or a new binding
// made through the same Local.
func TestCacheIsClearedByChanges(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	l, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	svc, _ := l.CreateIdentity(ctx, "root", iam.KindService, "svc")
	key, _ := l.CreateAPIKey(ctx, svc.ID, "", time.Time{})
	p, err := l.Authenticate(ctx, key.Token)
	if err != nil {
		t.Fatal(err)
	}
	req := iam.Request{TenantID: "root", Action: "compute:pools:create", Resource: iam.Resource{Type: "compute-pool", ID: "*"}}
	if d, _ := l.Authorize(ctx, p, req); d.Allowed {
		t.Fatal("allowed with no role")
	}
	role, _ := l.CreateRole(ctx, "root", "pools", iam.Policy{Version: 1, Statements: []iam.Statement{{Effect: iam.Allow, Actions: []string{"compute:pools:*"}, Resources: []string{"*"}}}})
	if err := l.Bind(ctx, svc.ID, role.ID, "root"); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Authorize(ctx, p, req); !d.Allowed {
		t.Fatalf("a new binding is not seen at once: %+v", d)
	}
	if err := l.RevokeAPIKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Authenticate(ctx, key.Token); !errors.Is(err, iam.ErrUnauthenticated) {
		t.Fatalf("a revoked key still authenticates from the cache: %v", err)
	}
}
