package compute_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/postgres/pgtest"
)

// apiProcess starts an API process whose IAM and decision caches keep what they learn for an
// hour, and returns it with the embedded IAM of another process on the same database.
func apiProcess(t *testing.T) (c *compute.Compute, elsewhere *iam.Local) {
	t.Helper()
	ctx := context.Background()
	sets, err := compute.MigrationSets()
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t, append(sets, iam.Migrations)...)
	here, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: computetest.RootTenantID, CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c, err = compute.New(compute.Options{Database: db, IAM: here, Secret: computetest.Secret, BaseURL: "http://compute.test",
		RootTenantID: computetest.RootTenantID, Mode: compute.ModeAPI, DecisionCacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	if elsewhere, err = iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: computetest.RootTenantID}); err != nil {
		t.Fatal(err)
	}
	return c, elsewhere
}

func code(err error) api.Code {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// TestRevocationReachesCaches: a key revoked by another process stops working within the event
// interval, though this process's IAM and decision caches would keep it for an hour.
func TestRevocationReachesCaches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, elsewhere := apiProcess(t)
	key, err := elsewhere.CreateAdminKey(ctx, computetest.RootTenantID, "ops")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // authenticated and decided, then cached
		if _, err := c.API.Pools.List(ctx, key.Token, api.ListPools{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := elsewhere.RevokeAPIKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, "a key revoked elsewhere refused", func() bool {
		_, err := c.API.Pools.List(ctx, key.Token, api.ListPools{})
		return code(err) == api.CodeUnauthenticated
	})
}

// TestBindingReachesCaches: a role bound by another process is used within the event interval,
// though this process has the denial cached for an hour.
func TestBindingReachesCaches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, elsewhere := apiProcess(t)
	svc, err := elsewhere.CreateIdentity(ctx, computetest.RootTenantID, iam.KindService, "reader")
	if err != nil {
		t.Fatal(err)
	}
	key, err := elsewhere.CreateAPIKey(ctx, svc.ID, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.API.Pools.List(ctx, key.Token, api.ListPools{}); code(err) != api.CodePermissionDenied {
		t.Fatalf("with no role = %v", err)
	}
	role, err := elsewhere.CreateRole(ctx, computetest.RootTenantID, "reader", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:pools:list"}, Resources: []string{"*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := elsewhere.Bind(ctx, svc.ID, role.ID, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	var last error
	defer func() {
		if t.Failed() {
			t.Logf("the last answer: %v", last)
		}
	}()
	computetest.Eventually(t, 30*time.Second, "a role bound elsewhere used", func() bool {
		_, last = c.API.Pools.List(ctx, key.Token, api.ListPools{})
		return last == nil
	})
}

// TestPolicyConditionsSeeResources: conditions on resource.* read Better Compute's own resources
// through the resolver it gives the embedded IAM.
func TestPolicyConditionsSeeResources(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := context.Background()
	root := env.Compute.API
	for _, p := range []api.CreatePool{{Name: "dev", Labels: map[string]string{"env": "dev"}}, {Name: "prod", Labels: map[string]string{"env": "prod"}}} {
		if _, err := root.Pools.Create(ctx, env.RootKey, p); err != nil {
			t.Fatal(err)
		}
	}
	ident, err := env.IAM.CreateIdentity(ctx, computetest.RootTenantID, iam.KindService, "dev-ops")
	if err != nil {
		t.Fatal(err)
	}
	role, err := env.IAM.CreateRole(ctx, computetest.RootTenantID, "dev-pools", iam.Policy{Version: 1, Statements: []iam.Statement{{
		Effect: iam.Allow, Actions: []string{"compute:pools:update"}, Resources: []string{"compute-pool/*"},
		Conditions: map[string]any{"StringEquals": map[string]any{"resource.labels.env": "dev"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.IAM.Bind(ctx, ident.ID, role.ID, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	key, err := env.IAM.CreateAPIKey(ctx, ident.ID, "k", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Pools.Update(ctx, key.Token, api.UpdatePool{Pool: "dev", Description: ptr("ok")}); err != nil {
		t.Fatalf("updating the dev pool: %v", err)
	}
	_, err = root.Pools.Update(ctx, key.Token, api.UpdatePool{Pool: "prod", Description: ptr("no")})
	if code(err) != api.CodePermissionDenied {
		t.Fatalf("updating the prod pool = %v, want permission denied", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestConfirmationOverHTTP: an agent's mutation that its delegation lists under confirm answers
// confirmation_required with the confirmation's id; once the person approves, the same call
// succeeds once, and the next is refused again.
func TestConfirmationOverHTTP(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	url := env.Server(t)
	ctx := context.Background()
	ada, err := env.IAM.CreateIdentity(ctx, computetest.RootTenantID, iam.KindUser, "ada")
	if err != nil {
		t.Fatal(err)
	}
	bot, err := env.IAM.CreateIdentity(ctx, computetest.RootTenantID, iam.KindAgent, "bot")
	if err != nil {
		t.Fatal(err)
	}
	role, err := env.IAM.CreateRole(ctx, computetest.RootTenantID, "sites", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:sites:*"}, Resources: []string{"*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.IAM.Bind(ctx, bot.ID, role.ID, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.IAM.CreateDelegation(ctx, computetest.RootTenantID, ada.ID, bot.ID, []string{"compute:sites:create"}); err != nil {
		t.Fatal(err)
	}
	key, err := env.IAM.CreateAPIKey(ctx, bot.ID, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c := post(t, url, key.Token, "sites/create", `{"name": "fra1"}`)
	id, _ := c.errDetail("confirmationId").(string)
	if c.status != 428 || c.errCode() != string(api.CodeConfirmationRequired) || id == "" {
		t.Fatalf("before approval = %d %s", c.status, c.raw)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.sites"); n != 0 {
		t.Fatalf("%d sites before approval", n)
	}
	shown, err := env.IAM.Confirmation(ctx, id)
	if err != nil || shown.Request.Method != "sites.create" || !strings.Contains(string(shown.Request.Input), `"name":"fra1"`) {
		t.Fatalf("the person is shown %+v (input %s), %v; want the call and its input", shown, shown.Request.Input, err)
	}
	if err := env.IAM.DecideConfirmation(ctx, id, ada.ID, true); err != nil {
		t.Fatal(err)
	}
	// The approval is of that call: another input does not spend it.
	if c := post(t, url, key.Token, "sites/create", `{"name": "ams1"}`); c.errCode() != string(api.CodeConfirmationRequired) {
		t.Fatalf("another input on the approval = %d %s", c.status, c.raw)
	}
	if c := post(t, url, key.Token, "sites/create", `{"name": "fra1"}`); c.status != 200 {
		t.Fatalf("after approval = %d %s", c.status, c.raw)
	}
	// The confirmed call is in the event log, its subject the confirmation.
	evs, err := events.About(ctx, env.DB.Pool, id)
	if err != nil || len(evs) != 1 || evs[0].Type != "action.confirmed" || evs[0].Data["method"] != "sites.create" || evs[0].Data["principal"] != bot.ID {
		t.Fatalf("events about the confirmation: %+v, %v; want one action.confirmed of sites.create by the agent", evs, err)
	}
	if c := post(t, url, key.Token, "sites/create", `{"name": "ams1"}`); c.errCode() != string(api.CodeConfirmationRequired) {
		t.Fatalf("a second use of the approval = %d %s", c.status, c.raw)
	}
	if c := post(t, url, key.Token, "sites/list", `{}`); c.status != 200 {
		t.Fatalf("a read the delegation does not list = %d %s", c.status, c.raw)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.sites"); n != 1 {
		t.Fatalf("%d sites, want the one approved", n)
	}
}

// TestRemoteIAM runs the control plane on a remote IAM: the embedded one served over HTTP on
// loopback, as a Better IAM server would be.
func TestRemoteIAM(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sets, err := compute.MigrationSets()
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t, append(sets, iam.Migrations)...)
	server, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: computetest.RootTenantID})
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.Handler())
	t.Cleanup(srv.Close)
	svc, err := server.CreateAdminKey(ctx, computetest.RootTenantID, "better-compute")
	if err != nil {
		t.Fatal(err)
	}
	newCompute := func(register bool) (*compute.Compute, error) {
		port, err := iam.Remote(srv.URL, svc.Token, iam.RemoteOptions{RegisterCatalog: register})
		if err != nil {
			t.Fatal(err)
		}
		c, err := compute.New(compute.Options{Database: db, IAM: port, Secret: computetest.Secret, BaseURL: "http://compute.test",
			RootTenantID: computetest.RootTenantID})
		if err != nil {
			t.Fatal(err)
		}
		return c, c.Initialize(ctx)
	}
	if _, err := newCompute(false); err == nil || !strings.Contains(err.Error(), "compute:") {
		t.Fatalf("Initialize on a deployment without the catalog = %v, want the missing actions named", err)
	}
	c, err := newCompute(true)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := server.CreateAdminKey(ctx, computetest.RootTenantID, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.API.Pools.Create(ctx, ops.Token, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	page, err := c.API.Pools.List(ctx, ops.Token, api.ListPools{})
	if err != nil || len(page.Items) != 1 {
		t.Fatalf("pools through a remote IAM: %+v, %v", page, err)
	}
	if _, err := c.API.Pools.List(ctx, iam.NewToken(iam.TokenAPIKey), api.ListPools{}); code(err) != api.CodeUnauthenticated {
		t.Fatalf("an unknown key through a remote IAM = %v", err)
	}
}
