package iam_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// world is what the conformance suite sets up through the embedded IAM's admin calls; the port
// under test is either that IAM or a remote client of it.
type world struct {
	port  iam.Port
	admin *iam.Local
	db    *postgres.DB
}

type portKind struct {
	name string
	make func(t *testing.T, admin *iam.Local) iam.Port
}

var kinds = []portKind{
	{"embedded", func(_ *testing.T, admin *iam.Local) iam.Port { return admin }},
	{"remote", func(t *testing.T, admin *iam.Local) iam.Port {
		srv := httptest.NewServer(admin.Handler())
		t.Cleanup(srv.Close)
		key, err := admin.CreateAdminKey(context.Background(), "root", "better-compute")
		if err != nil {
			t.Fatal(err)
		}
		r, err := iam.Remote(srv.URL, key.Token, iam.RemoteOptions{RegisterCatalog: true})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}},
}

// conformance runs fn against every kind of port.
func conformance(t *testing.T, fn func(t *testing.T, w world)) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			db := pgtest.New(t, postgres.Core, iam.Migrations)
			admin, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1})
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Initialize(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer failed(t)
			fn(t, world{port: k.make(t, admin), admin: admin, db: db})
		})
	}
}

// must returns v, or fails the test through the panic that conformance recovers: Go does not let a
// call's two results be passed alongside a *testing.T.
func must[T any](v T, err error) T {
	if err != nil {
		panic(failure{err})
	}
	return v
}

type failure struct{ err error }

// failed, deferred, turns a must failure into t.Fatal.
func failed(t *testing.T) {
	if r := recover(); r != nil {
		f, ok := r.(failure)
		if !ok {
			panic(r)
		}
		t.Fatal(f.err)
	}
}

func allow(actions ...string) iam.Policy {
	return iam.Policy{Version: 1, Statements: []iam.Statement{{Effect: iam.Allow, Actions: actions, Resources: []string{"*"}}}}
}

func pool(tenant, action string) iam.Request {
	return iam.Request{TenantID: tenant, Action: action, Resource: iam.Resource{Type: "compute-pool", ID: "p1"}}
}

func TestConformanceTokens(t *testing.T) {
	t.Parallel()
	conformance(t, func(t *testing.T, w world) {
		ctx := context.Background()
		a := w.admin
		svc := must(a.CreateIdentity(ctx, "root", iam.KindService, "svc"))
		ada := must(a.CreateIdentity(ctx, "root", iam.KindUser, "ada"))
		bot := must(a.CreateIdentity(ctx, "root", iam.KindAgent, "bot"))
		role := must(a.CreateRole(ctx, "root", "reader", allow("compute:*:get")))
		check(t, a.Bind(ctx, svc.ID, role.ID, "root"))
		key := must(a.CreateAPIKey(ctx, svc.ID, "k", time.Now().Add(time.Hour)))
		ses := must(a.CreateSession(ctx, ada.ID, time.Hour))
		sts := must(a.IssueSTS(ctx, svc.ID, time.Hour))
		rol := must(a.AssumeRole(ctx, svc.ID, role.ID, time.Hour))
		dlg := must(a.IssueDelegationToken(ctx, must(a.CreateDelegation(ctx, "root", ada.ID, bot.ID, nil)).ID, time.Hour))
		for _, c := range []struct {
			token, identity string
			kind            iam.TokenKind
		}{{key.Token, svc.ID, iam.TokenAPIKey}, {ses.Token, ada.ID, iam.TokenSession}, {sts.Token, svc.ID, iam.TokenSTS},
			{rol.Token, svc.ID, iam.TokenRole}, {dlg.Token, bot.ID, iam.TokenDelegation}} {
			p, err := w.port.Authenticate(ctx, c.token)
			if err != nil || p.ID != c.identity || p.TokenKind != c.kind || p.TenantID != "root" {
				t.Errorf("%s token: %+v, %v", c.kind, p, err)
			}
		}
		if p, _ := w.port.Authenticate(ctx, rol.Token); p.RoleID != role.ID {
			t.Errorf("a role token's principal has role %q", p.RoleID)
		}
		bad := key.Token[:len(key.Token)-1] + "x"
		if key.Token[len(key.Token)-1] == 'x' {
			bad = key.Token[:len(key.Token)-1] + "y"
		}
		for name, tok := range map[string]string{"bad checksum": bad, "unknown": iam.NewToken(iam.TokenAPIKey),
			"not a token": "password1", "empty": "", "unknown session": iam.NewToken(iam.TokenSession)} {
			if _, err := w.port.Authenticate(ctx, tok); !errors.Is(err, iam.ErrUnauthenticated) {
				t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
			}
		}
		// Expiry follows compute_now(); revocation is at once.
		w.db.SetNow(time.Now().Add(2 * time.Hour))
		for name, tok := range map[string]string{"expired key": key.Token, "expired session": ses.Token} {
			if _, err := w.port.Authenticate(ctx, tok); !errors.Is(err, iam.ErrUnauthenticated) {
				t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
			}
		}
		w.db.ResetNow()
		check(t, a.RevokeAPIKey(ctx, key.ID))
		check(t, a.RevokeToken(ctx, sts.ID))
		for name, tok := range map[string]string{"revoked key": key.Token, "revoked STS token": sts.Token} {
			if _, err := w.port.Authenticate(ctx, tok); !errors.Is(err, iam.ErrUnauthenticated) {
				t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
			}
		}
	})
}

func TestConformanceDecisions(t *testing.T) {
	t.Parallel()
	conformance(t, func(t *testing.T, w world) {
		ctx := context.Background()
		a := w.admin
		must(a.CreateTenant(ctx, iam.CreateTenant{ID: "org-a", ParentID: "root"}))
		must(a.CreateTenant(ctx, iam.CreateTenant{ID: "proj-a", ParentID: "org-a"}))
		must(a.CreateTenant(ctx, iam.CreateTenant{ID: "org-b", ParentID: "root"}))
		svc := must(a.CreateIdentity(ctx, "org-a", iam.KindService, "ops"))
		doc := iam.Policy{Version: 1, Statements: []iam.Statement{
			{Sid: "pools", Effect: iam.Allow, Actions: []string{"compute:pools:*"}, Resources: []string{"compute-pool/*"}},
			{Sid: "no-delete", Effect: iam.Deny, Actions: []string{"compute:pools:delete"}, Resources: []string{"compute-pool/p1"}},
			{Sid: "own", Effect: iam.Allow, Actions: []string{"compute:reservations:release"}, Resources: []string{"compute-reservation/${principal.id}-*"}},
			{Sid: "services", Effect: iam.Allow, Actions: []string{"compute:sites:create"}, Resources: []string{"*"},
				Conditions: map[string]any{"StringEquals": map[string]any{"principal.kind": "service"}}},
			{Sid: "office", Effect: iam.Allow, Actions: []string{"compute:sites:delete"}, Resources: []string{"*"},
				Conditions: map[string]any{"IpAddress": map[string]any{"request.ip": "10.0.0.0/8"}}},
			{Sid: "small", Effect: iam.Allow, Actions: []string{"compute:quotas:set"}, Resources: []string{"*"},
				Conditions: map[string]any{"NumericLessThan": map[string]any{"request.limit": 17}}},
			{Sid: "before", Effect: iam.Allow, Actions: []string{"compute:devices:setMode"}, Resources: []string{"*"},
				Conditions: map[string]any{"DateBefore": map[string]any{"request.time": "2100-01-01T00:00:00Z"}}},
			{Sid: "tagged", Effect: iam.Allow, Actions: []string{"compute:nodes:cordon"}, Resources: []string{"*"},
				Conditions: map[string]any{"ArrayContains": map[string]any{"request.tags": "maintenance"}, "Bool": map[string]any{"request.mfa": true}}},
			{Sid: "ticket", Effect: iam.Allow, Actions: []string{"compute:nodes:retire"}, Resources: []string{"*"},
				Conditions: map[string]any{"Exists": map[string]any{"request.ticket": true}, "StringLike": map[string]any{"request.ticket": "OPS-*"}}},
		}}
		role := must(a.CreateRole(ctx, "org-a", "ops", doc))
		check(t, a.Bind(ctx, svc.ID, role.ID, "org-a"))
		key := must(a.CreateAPIKey(ctx, svc.ID, "", time.Time{}))
		p := must(w.port.Authenticate(ctx, key.Token))
		with := func(r iam.Request, kv ...any) iam.Request {
			r.Context = map[string]any{}
			for i := 0; i+1 < len(kv); i += 2 {
				r.Context[kv[i].(string)] = kv[i+1]
			}
			return r
		}
		res := func(typ, id string) iam.Resource { return iam.Resource{Type: typ, ID: id} }
		cases := []struct {
			name string
			req  iam.Request
			want bool
		}{
			{"allowed by a glob", pool("org-a", "compute:pools:create"), true},
			{"in a child tenant", pool("proj-a", "compute:pools:update"), true},
			{"outside the tenant tree", pool("org-b", "compute:pools:create"), false},
			{"in the parent", pool("root", "compute:pools:create"), false},
			{"explicit deny over allow", pool("org-a", "compute:pools:delete"), false},
			{"deny is only for p1", iam.Request{TenantID: "org-a", Action: "compute:pools:delete", Resource: res("compute-pool", "p2")}, true},
			{"no statement", pool("org-a", "compute:reservations:create"), false},
			{"a variable: own", iam.Request{TenantID: "org-a", Action: "compute:reservations:release", Resource: res("compute-reservation", svc.ID+"-1")}, true},
			{"a variable: another's", iam.Request{TenantID: "org-a", Action: "compute:reservations:release", Resource: res("compute-reservation", "idn_other-1")}, false},
			{"StringEquals", pool("org-a", "compute:sites:create"), true},
			{"IpAddress inside", with(pool("org-a", "compute:sites:delete"), "request.ip", "10.2.3.4"), true},
			{"IpAddress outside", with(pool("org-a", "compute:sites:delete"), "request.ip", "192.0.2.1"), false},
			{"IpAddress missing", pool("org-a", "compute:sites:delete"), false},
			{"NumericLessThan", with(pool("org-a", "compute:quotas:set"), "request.limit", 16), true},
			{"NumericLessThan over", with(pool("org-a", "compute:quotas:set"), "request.limit", 64), false},
			{"DateBefore", pool("org-a", "compute:devices:setMode"), true},
			{"ArrayContains and Bool", with(pool("org-a", "compute:nodes:cordon"), "request.tags", []any{"maintenance"}, "request.mfa", true), true},
			{"Bool false", with(pool("org-a", "compute:nodes:cordon"), "request.tags", []any{"maintenance"}, "request.mfa", false), false},
			{"Exists and StringLike", with(pool("org-a", "compute:nodes:retire"), "request.ticket", "OPS-12"), true},
			{"Exists missing", pool("org-a", "compute:nodes:retire"), false},
		}
		var reqs []iam.Request
		for _, c := range cases {
			d, err := w.port.Authorize(ctx, p, c.req)
			if err != nil || d.Allowed != c.want {
				t.Errorf("%s: %+v, %v; want allowed %v", c.name, d, err, c.want)
			}
			reqs = append(reqs, c.req)
		}
		many := must(w.port.AuthorizeMany(ctx, p, reqs))
		for i, d := range many {
			if d.Allowed != cases[i].want {
				t.Errorf("AuthorizeMany[%d] (%s) = %v", i, cases[i].name, d.Allowed)
			}
		}
		// A role token decides with that role alone.
		other := must(a.CreateRole(ctx, "org-a", "sites", allow("compute:sites:*")))
		check(t, a.Bind(ctx, svc.ID, other.ID, "org-a"))
		rol := must(a.AssumeRole(ctx, svc.ID, other.ID, time.Hour))
		rp := must(w.port.Authenticate(ctx, rol.Token))
		if d := must(w.port.Authorize(ctx, rp, pool("org-a", "compute:pools:create"))); d.Allowed {
			t.Error("a role token used another role's policy")
		}
		if d := must(w.port.Authorize(ctx, rp, pool("org-a", "compute:sites:list"))); !d.Allowed {
			t.Error("a role token did not use its own role")
		}
		// The tenant tree.
		if path := must(w.port.TenantPath(ctx, "proj-a")); strings.Join(path, ",") != "proj-a,org-a,root" {
			t.Errorf("TenantPath = %v", path)
		}
		if ok := must(iam.TenantWithin(ctx, w.port, "proj-a", "org-b")); ok {
			t.Error("proj-a is within org-b")
		}
	})
}

func TestConformanceCatalogBillingFlagsEvents(t *testing.T) {
	t.Parallel()
	conformance(t, func(t *testing.T, w world) {
		ctx := context.Background()
		a := w.admin
		cat := iam.Catalog{ResourceTypes: []iam.ResourceType{{Name: "compute-pool"}},
			Actions: []iam.Action{{Name: "compute:pools:create", ResourceType: "compute-pool"}}}
		check(t, w.port.RegisterCatalog(ctx, cat))
		got := must(a.Catalog(ctx))
		if len(got.Actions) != 1 || got.Actions[0].Name != "compute:pools:create" {
			t.Fatalf("catalog = %+v", got)
		}
		// Billing: a repeated key returns the first receipt.
		check(t, w.port.EnsureMeters(ctx, []iam.Meter{{Key: "gpu.h100.hours", Unit: "GPU-hour"}}))
		u := iam.Usage{TenantID: "root", Meter: "gpu.h100.hours", Quantity: 2.5, OccurredAt: time.Now(), IdempotencyKey: "w-1"}
		r1 := must(w.port.RecordUsage(ctx, u))
		u.Quantity = 99
		r2 := must(w.port.RecordUsage(ctx, u))
		if r1.Duplicate || !r2.Duplicate || r1.ID != r2.ID {
			t.Fatalf("receipts %+v then %+v", r1, r2)
		}
		if total, n, _ := a.UsageTotal(ctx, "root", "gpu.h100.hours"); total != 2.5 || n != 1 {
			t.Fatalf("usage %v in %d records", total, n)
		}
		if _, err := w.port.RecordUsage(ctx, iam.Usage{TenantID: "root", Meter: "gpu.nope.hours", Quantity: 1, OccurredAt: time.Now(), IdempotencyKey: "w-2"}); err == nil {
			t.Fatal("usage on an unknown meter was recorded")
		}
		// Flags: the default, and an override that a descendant inherits.
		must(a.CreateTenant(ctx, iam.CreateTenant{ID: "org", ParentID: "root"}))
		must(a.CreateTenant(ctx, iam.CreateTenant{ID: "proj", ParentID: "org"}))
		check(t, a.SetFlag(ctx, "compute.spot", false, "spot reservations"))
		check(t, a.OverrideFlag(ctx, "compute.spot", "org", true))
		for tenant, want := range map[string]bool{"root": false, "org": true, "proj": true} {
			if v, err := w.port.Flag(ctx, tenant, "compute.spot"); err != nil || v != want {
				t.Errorf("flag in %s = %v, %v; want %v", tenant, v, err, want)
			}
		}
		if _, err := w.port.Flag(ctx, "root", "no.such.flag"); !errors.Is(err, iam.ErrNotFound) {
			t.Errorf("an unknown flag = %v, want ErrNotFound", err)
		}
		// Events: what changed, in order, from a cursor.
		_, cursor := must2(t)(w.port.Events(ctx, -1, 0))
		svc := must(a.CreateIdentity(ctx, "root", iam.KindService, "gone"))
		key := must(a.CreateAPIKey(ctx, svc.ID, "", time.Time{}))
		check(t, a.RevokeAPIKey(ctx, key.ID))
		check(t, a.DeleteTenant(ctx, "proj"))
		evs, _ := must2(t)(w.port.Events(ctx, cursor, 0))
		var types []string
		for _, e := range evs {
			types = append(types, e.Type)
		}
		if strings.Join(types, ",") != "key.revoked,tenant.deleted" || evs[0].Subject != svc.ID {
			t.Fatalf("events after the cursor = %v (%+v)", types, evs)
		}
	})
}

func must2(t *testing.T) func([]iam.Event, int64, error) ([]iam.Event, int64) {
	return func(e []iam.Event, n int64, err error) ([]iam.Event, int64) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return e, n
	}
}

func TestConformanceConfirmation(t *testing.T) {
	t.Parallel()
	conformance(t, func(t *testing.T, w world) {
		ctx := context.Background()
		a := w.admin
		ada := must(a.CreateIdentity(ctx, "root", iam.KindUser, "ada"))
		bot := must(a.CreateIdentity(ctx, "root", iam.KindAgent, "bot"))
		role := must(a.CreateRole(ctx, "root", "pools", allow("compute:pools:*")))
		check(t, a.Bind(ctx, bot.ID, role.ID, "root"))
		must(a.CreateDelegation(ctx, "root", ada.ID, bot.ID, []string{"compute:pools:delete"}))
		key := must(a.CreateAPIKey(ctx, bot.ID, "", time.Time{}))
		p := must(w.port.Authenticate(ctx, key.Token))
		call := func(input string) iam.Request {
			r := pool("root", "compute:pools:delete")
			r.Method, r.Input = "pools.delete", json.RawMessage(input)
			return r
		}
		req := call(`{"pool": "p1", "gpus": 1}`)
		if d := must(w.port.Authorize(ctx, p, pool("root", "compute:pools:list"))); !d.Allowed {
			t.Fatal("an action the delegation does not reserve needs a confirmation")
		}
		d := must(w.port.Authorize(ctx, p, req))
		if d.Allowed || !d.ConfirmationRequired {
			t.Fatalf("a reserved action = %+v, want confirmation required", d)
		}
		c := must(w.port.RequestConfirmation(ctx, p, req))
		// The same call spaced and ordered differently is the same call.
		if again := must(w.port.RequestConfirmation(ctx, p, call(`{"gpus":1,"pool":"p1"}`))); again.ID != c.ID || c.State != "pending" {
			t.Fatalf("confirmations %+v and %+v", c, again)
		}
		if c.Request.Method != "pools.delete" || string(c.Request.Input) != `{"gpus":1,"pool":"p1"}` || c.InputHash == "" ||
			!c.ExpiresAt.After(time.Now()) {
			t.Fatalf("the confirmation shows %+v (input %s), want the call's method, canonical input, hash and expiry", c, c.Request.Input)
		}
		other := call(`{"pool": "p1", "gpus": 512}`)
		if c2 := must(w.port.RequestConfirmation(ctx, p, other)); c2.ID == c.ID {
			t.Fatal("a call with another input shares the confirmation of the first")
		}
		check(t, a.DecideConfirmation(ctx, c.ID, ada.ID, true))
		if got := must(w.port.Confirmation(ctx, c.ID)); got.State != "approved" || got.DecidedBy != ada.ID || string(got.Request.Input) != `{"gpus":1,"pool":"p1"}` {
			t.Fatalf("confirmation after approval = %+v", got)
		}
		// Approved for input X does not authorize input Y, nor another method with input X.
		if d := must(w.port.Authorize(ctx, p, other)); d.Allowed || !d.ConfirmationRequired {
			t.Fatalf("a 512-GPU call on a 1-GPU approval = %+v", d)
		}
		wrongMethod := req
		wrongMethod.Method = "pools.update"
		if d := must(w.port.Authorize(ctx, p, wrongMethod)); d.Allowed {
			t.Fatalf("another method with the approved input = %+v", d)
		}
		if d := must(w.port.Authorize(ctx, p, call(`{"gpus": 1, "pool": "p1"}`))); !d.Allowed {
			t.Fatalf("after approval = %+v", d)
		}
		// Spent once.
		if d := must(w.port.Authorize(ctx, p, req)); d.Allowed || !d.ConfirmationRequired {
			t.Fatalf("a second use of one confirmation = %+v", d)
		}
		if got := must(w.port.Confirmation(ctx, c.ID)); got.State != "consumed" {
			t.Fatalf("confirmation after use = %+v", got)
		}

		// Expired does not authorize: neither an approved one past its expiry, nor an approval
		// given after it.
		later := call(`{"pool": "p1", "gpus": 2}`)
		c3 := must(w.port.RequestConfirmation(ctx, p, later))
		c4 := must(w.port.RequestConfirmation(ctx, p, call(`{"pool": "p1", "gpus": 3}`)))
		check(t, a.DecideConfirmation(ctx, c3.ID, ada.ID, true))
		w.db.SetNow(c3.ExpiresAt.Add(time.Second))
		defer w.db.ResetNow()
		if d := must(w.port.Authorize(ctx, p, later)); d.Allowed || !d.ConfirmationRequired {
			t.Fatalf("an expired approval = %+v", d)
		}
		if got := must(w.port.Confirmation(ctx, c3.ID)); got.State != "expired" {
			t.Fatalf("an approved confirmation past its expiry = %+v", got)
		}
		if err := a.DecideConfirmation(ctx, c4.ID, ada.ID, true); !errors.Is(err, iam.ErrNotFound) {
			t.Fatalf("approving an expired confirmation = %v", err)
		}
		if c5 := must(w.port.RequestConfirmation(ctx, p, later)); c5.ID == c3.ID || c5.State != "pending" {
			t.Fatalf("asking again after expiry = %+v, want a new pending confirmation", c5)
		}
	})
}

// TestRemoteSaysWhenTheCatalogIsMissing: without registering, a remote port checks the catalog
// and names what is missing.
func TestRemoteSaysWhenTheCatalogIsMissing(t *testing.T) {
	t.Parallel()
	defer failed(t)
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	admin, _ := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"})
	ctx := context.Background()
	check(t, admin.Initialize(ctx))
	srv := httptest.NewServer(admin.Handler())
	defer srv.Close()
	key := must(admin.CreateAdminKey(ctx, "root", "svc"))
	r := must(iam.Remote(srv.URL, key.Token, iam.RemoteOptions{}))
	err := r.RegisterCatalog(ctx, iam.Catalog{ResourceTypes: []iam.ResourceType{{Name: "compute-pool"}},
		Actions: []iam.Action{{Name: "compute:pools:create", ResourceType: "compute-pool"}}})
	if err == nil || !strings.Contains(err.Error(), "compute:pools:create") || !strings.Contains(err.Error(), "RegisterCatalog") {
		t.Fatalf("RegisterCatalog against a deployment without the catalog = %v", err)
	}
	// A key that may not call the contract is refused with ACCESS_DENIED.
	weak := must(admin.CreateIdentity(ctx, "root", iam.KindService, "weak"))
	wk := must(admin.CreateAPIKey(ctx, weak.ID, "", time.Time{}))
	r2 := must(iam.Remote(srv.URL, wk.Token, iam.RemoteOptions{}))
	if _, err := r2.TenantPath(ctx, "root"); err == nil || !strings.Contains(err.Error(), iam.HTTPAccessDenied) {
		t.Fatalf("a key without iam rights = %v, want ACCESS_DENIED", err)
	}
	if _, err := iam.Remote("ftp://x", key.Token, iam.RemoteOptions{}); err == nil {
		t.Fatal("an ftp URL was accepted")
	}
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRemoteRetriesOnlyWhatMayBeRetried: a 5xx answer is retried, a refusal is not.
func TestRemoteRetriesOnlyWhatMayBeRetried(t *testing.T) {
	t.Parallel()
	defer failed(t)
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	admin := must(iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"}))
	ctx := context.Background()
	check(t, admin.Initialize(ctx))
	var calls, failures atomic.Int32
	failures.Store(1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if failures.Add(-1) >= 0 {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		admin.Handler().ServeHTTP(w, r)
	}))
	defer srv.Close()
	key := must(admin.CreateAdminKey(ctx, "root", "svc"))
	r := must(iam.Remote(srv.URL, key.Token, iam.RemoteOptions{Retries: 2}))
	if path, err := r.TenantPath(ctx, "root"); err != nil || len(path) != 1 || calls.Load() != 2 {
		t.Fatalf("after one 502: %v, %v in %d calls; want the root in 2", path, err, calls.Load())
	}
	calls.Store(0)
	weak := must(admin.CreateIdentity(ctx, "root", iam.KindService, "weak"))
	wk := must(admin.CreateAPIKey(ctx, weak.ID, "", time.Time{}))
	r2 := must(iam.Remote(srv.URL, wk.Token, iam.RemoteOptions{Retries: 2}))
	if _, err := r2.TenantPath(ctx, "root"); err == nil || calls.Load() != 1 {
		t.Fatalf("a refusal: %v in %d calls, want an error in 1", err, calls.Load())
	}
	failures.Store(5)
	calls.Store(0)
	if _, err := r.TenantPath(ctx, "root"); err == nil || calls.Load() != 3 {
		t.Fatalf("a server that keeps failing: %v in %d calls, want an error after 3", err, calls.Load())
	}
}

// TestContractRefusesBadRequests: the served contract names what is wrong with a request.
func TestContractRefusesBadRequests(t *testing.T) {
	t.Parallel()
	defer failed(t)
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	admin := must(iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"}))
	ctx := context.Background()
	check(t, admin.Initialize(ctx))
	key := must(admin.CreateAdminKey(ctx, "root", "svc"))
	srv := httptest.NewServer(admin.Handler())
	defer srv.Close()
	for _, c := range []struct {
		name, route, body string
		header            bool
		status            int
		code, mention     string
	}{
		{"no CSRF header", "tenants/path", `{"tenantId": "root"}`, false, 403, iam.HTTPInvalidRequest, "X-Better-IAM"},
		{"an unknown field", "tenants/path", `{"tenant": "root"}`, true, 400, iam.HTTPInvalidRequest, `"tenant"`},
		{"trailing data", "tenants/path", `{"tenantId": "root"} {}`, true, 400, iam.HTTPInvalidRequest, "after the JSON"},
		{"not JSON", "billing/record", `meters`, true, 400, iam.HTTPInvalidRequest, "billing/record"},
		{"an unknown route", "tenants/create", `{}`, true, 404, iam.HTTPNotFound, "tenants/create"},
	} {
		req := must(http.NewRequest(http.MethodPost, srv.URL+iam.BasePath+c.route, strings.NewReader(c.body)))
		req.Header.Set("Authorization", "Bearer "+key.Token)
		if c.header {
			req.Header.Set("X-Better-IAM", "1")
		}
		resp := must(http.DefaultClient.Do(req))
		var env struct {
			Error struct{ Code, Message string }
		}
		err := json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || env.Error.Code != c.code || !strings.Contains(env.Error.Message, c.mention) {
			t.Errorf("%s: %d %+v (%v); want %d %s naming %s", c.name, resp.StatusCode, env.Error, err, c.status, c.code, c.mention)
		}
	}
}
