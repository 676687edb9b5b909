package fleetconfig_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/fleetconfig"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ptr[T any](v T) *T { return &v }

// built is a fleet made through the ordinary methods: two sites, three pools (one with a TPM
// policy, one at no site), quotas on the root tenant and a child, two webhooks.
func built(t *testing.T) *computetest.Env {
	t.Helper()
	env := computetest.New(t, computetest.Options{})
	env.Tenant(t, "t1")
	ctx := context.Background()
	a, k := env.Compute.API, env.RootKey
	must(t)(a.Sites.Create(ctx, k, api.CreateSite{Name: "fra1", DisplayName: "Frankfurt 1", Labels: map[string]string{"region": "eu"}}))
	must(t)(a.Sites.Create(ctx, k, api.CreateSite{Name: "ams1"}))
	must(t)(a.Pools.Create(ctx, k, api.CreatePool{Name: "h100", Site: "fra1", Description: "eight H100s a node", Labels: map[string]string{"tier": "gold"},
		Attestation: &api.PoolAttestation{TPM: api.TPMOptional}}))
	must(t)(a.Pools.Create(ctx, k, api.CreatePool{Name: "a100", Site: "ams1"}))
	must(t)(a.Pools.Create(ctx, k, api.CreatePool{Name: "cpu", DisplayName: "CPU only"}))
	must(t)(a.Quotas.Set(ctx, k, api.SetQuota{TenantID: "t1", Pool: "h100", Resource: api.QuotaGPUs, Model: "h100", Limit: 16}))
	must(t)(a.Quotas.Set(ctx, k, api.SetQuota{TenantID: computetest.RootTenantID, Pool: "cpu", Resource: api.QuotaVCPUs, Limit: 0}))
	must(t)(a.Webhooks.Create(ctx, k, api.CreateWebhook{URL: "https://hooks.example.com/compute", EventTypes: []string{"node.", "fleet.drifted"}, Description: "ops"}))
	must(t)(a.Webhooks.Create(ctx, k, api.CreateWebhook{URL: "https://audit.example.com/in"}))
	return env
}

func must(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func export(t *testing.T, env *computetest.Env) api.ExportedFleet {
	t.Helper()
	x, err := env.Compute.API.Fleet.Export(context.Background(), env.RootKey, api.ExportFleet{})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func plan(t *testing.T, env *computetest.Env, doc string, prune bool) api.FleetDiff {
	t.Helper()
	p, err := env.Compute.API.Fleet.Plan(context.Background(), env.RootKey, api.PlanFleet{Document: doc, Prune: prune})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	return p
}

func codeOf(err error) (api.Code, map[string]any) {
	var e *api.Error
	if errors.As(err, &e) {
		return e.Code, e.Details
	}
	return api.CodeOf(err), nil
}

// TestExportApplyRoundTrip: what fleet.export writes, planned against the state it came from,
// changes nothing and has the export's fingerprint; applied, it changes nothing, and the state
// exports to the same bytes again. The export names every kind, no ids, no secrets.
func TestExportApplyRoundTrip(t *testing.T) {
	t.Parallel()
	env := built(t)
	x := export(t, env)
	if again := export(t, env); again.Document != x.Document || again.Fingerprint != x.Fingerprint {
		t.Fatalf("two exports of one state differ:\n%s\n%s", x.Document, again.Document)
	}
	for _, want := range []string{"metadata:\n  tenant: root\n", "  manages:\n  - sites\n  - pools\n  - quotas\n  - webhooks\n",
		"  - name: ams1\n", "  - name: h100\n    site: fra1\n", "tpm: optional", "  - tenant: t1\n    pool: h100\n    resource: gpus\n    model: h100\n    limit: 16\n",
		"    resource: vcpus\n    limit: 0\n", "  - url: https://audit.example.com/in\n", "    - fleet.drifted\n    - node.\n"} {
		if !strings.Contains(x.Document, want) {
			t.Errorf("the export lacks %q:\n%s", want, x.Document)
		}
	}
	for _, secretish := range []string{"whsec_", "id:", "secret"} {
		if strings.Contains(x.Document, secretish) {
			t.Errorf("the export carries %q:\n%s", secretish, x.Document)
		}
	}
	p := plan(t, env, x.Document, true)
	if len(p.Changes) != 0 || len(p.Kept) != 0 || p.Fingerprint != x.Fingerprint {
		t.Fatalf("the plan of the export = %+v, want no changes and fingerprint %s", p, x.Fingerprint)
	}
	env.Counter.Reset()
	res, err := env.Compute.API.Fleet.Apply(context.Background(), env.RootKey, api.ApplyFleet{Document: x.Document, Fingerprint: p.Fingerprint, Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 0 || res.Fingerprint != x.Fingerprint || res.AppliedBy == "" || res.AppliedAt.IsZero() {
		t.Fatalf("apply of the export = %+v, want nothing changed and the same fingerprint", res)
	}
	if after := export(t, env); after.Document != x.Document {
		t.Fatalf("the state changed:\n%s\n%s", x.Document, after.Document)
	}
}

const changed = `apiVersion: compute/v1
kind: FleetConfig
spec:
  manages: [sites, pools, quotas, webhooks]
  sites:
  - name: fra1
    displayName: Frankfurt One
    labels: {region: eu}
  - name: ams1
  - name: par1
  pools:
  - name: h100
    site: fra1
    description: eight H100s a node
    labels: {tier: gold}
    attestation: {tpm: optional}
  - name: a100
    site: ams1
  - name: l40s
    site: par1
    labels: {tier: silver}
  - name: cpu
    displayName: CPU only
  quotas:
  - {tenant: t1, pool: h100, resource: gpus, model: h100, limit: 32}
  - {pool: cpu, resource: vcpus, limit: 0}
  - {tenant: t1, pool: l40s, resource: gpus, limit: 4}
  webhooks:
  - url: https://hooks.example.com/compute
    description: ops
    eventTypes: [fleet.]
`

// TestPlanAndApply: a plan shows each creation, update and deletion with its fields (old and
// new), in the order an apply makes them; without prune what the document leaves out is kept;
// the apply makes exactly the plan, after which the plan is empty and the state is the document.
func TestPlanAndApply(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	kept := plan(t, env, changed, false)
	if diff := cmp.Diff([]api.FleetObject{{Kind: "webhook", Key: "https://audit.example.com/in"}}, kept.Kept); diff != "" {
		t.Fatalf("kept without prune (-want +got):\n%s", diff)
	}
	p := plan(t, env, changed, true)
	want := []api.FleetChange{
		{Action: "update", Kind: "site", Key: "fra1", Path: "spec.sites[0]", Fields: []api.FieldChange{{Field: "displayName", Old: "Frankfurt 1", New: "Frankfurt One"}}},
		{Action: "create", Kind: "site", Key: "par1", Path: "spec.sites[2]"},
		{Action: "create", Kind: "pool", Key: "l40s", Path: "spec.pools[2]", Fields: []api.FieldChange{{Field: "site", New: "par1"}, {Field: "labels", New: map[string]string{"tier": "silver"}}}},
		{Action: "update", Kind: "quota", Key: "t1/h100/gpus/h100", Path: "spec.quotas[0]", Fields: []api.FieldChange{{Field: "limit", Old: 16, New: 32}}},
		{Action: "create", Kind: "quota", Key: "t1/l40s/gpus", Path: "spec.quotas[2]", Fields: []api.FieldChange{{Field: "limit", New: 4}}},
		{Action: "update", Kind: "webhook", Key: "https://hooks.example.com/compute", Path: "spec.webhooks[0]",
			Fields: []api.FieldChange{{Field: "eventTypes", Old: []string{"fleet.drifted", "node."}, New: []string{"fleet."}}}},
		{Action: "delete", Kind: "webhook", Key: "https://audit.example.com/in"},
	}
	if diff := cmp.Diff(want, p.Changes); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	if p.Summary != (api.FleetSummary{Create: 3, Update: 3, Delete: 1}) || len(p.Kept) != 0 {
		t.Fatalf("summary %+v, kept %v", p.Summary, p.Kept)
	}
	var secretBefore []byte
	if err := env.DB.Pool.QueryRow(ctx, `SELECT secret FROM compute.webhook_endpoints WHERE url = 'https://hooks.example.com/compute'`).Scan(&secretBefore); err != nil {
		t.Fatal(err)
	}
	res, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p.Changes, res.Changes); diff != "" {
		t.Fatalf("the apply did otherwise than the plan (-plan +apply):\n%s", diff)
	}
	if again := plan(t, env, changed, true); len(again.Changes) != 0 || again.Fingerprint != res.Fingerprint {
		t.Fatalf("after the apply the plan is %+v, want empty with fingerprint %s", again, res.Fingerprint)
	}
	q, err := env.Compute.API.Quotas.List(ctx, env.RootKey, api.ListQuotas{TenantID: "t1"})
	if err != nil || len(q.Items) != 2 {
		t.Fatalf("t1's quotas = %+v, %v", q, err)
	}
	var secretAfter []byte
	var types []string
	if err := env.DB.Pool.QueryRow(ctx, `SELECT secret, event_types FROM compute.webhook_endpoints WHERE url = 'https://hooks.example.com/compute'`).Scan(&secretAfter, &types); err != nil {
		t.Fatal(err)
	}
	if string(secretAfter) != string(secretBefore) || !cmp.Equal(types, []string{"fleet."}) {
		t.Fatalf("the updated endpoint has event types %v and its secret changed: %v", types, string(secretAfter) != string(secretBefore))
	}
	var n int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.events WHERE type = 'fleet.applied' AND tenant_id = 'root' AND data->>'create' = '3'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("fleet.applied events = %d, %v", n, err)
	}
}

// TestNewWebhookSecretShownOnce: an endpoint an apply creates has a secret, answered once by
// the apply (not by a replay with the same idempotency key), and never in the document.
func TestNewWebhookSecretShownOnce(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	doc := "apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [webhooks]\n  webhooks:\n  - url: https://hooks.example.com/new\n"
	p := plan(t, env, doc, false)
	ctx := api.WithIdempotencyKey(context.Background(), "apply-1")
	in := api.ApplyFleet{Document: doc, Fingerprint: p.Fingerprint}
	res, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, in)
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Secrets["https://hooks.example.com/new"]; !strings.HasPrefix(s, api.WebhookSecretPrefix) {
		t.Fatalf("secrets = %v", res.Secrets)
	}
	replay, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, in)
	if err != nil || replay.Secrets != nil || replay.Fingerprint != res.Fingerprint {
		t.Fatalf("replay = %+v, %v; want the answer without its secrets", replay, err)
	}
	if x := export(t, env); strings.Contains(x.Document, "whsec_") {
		t.Fatal("the export carries a secret")
	}
}

// TestStalePlanRefused: a change between the plan and the apply (here, a site renamed for
// display) makes the apply fail with failed_precondition, reason stale_plan, and write nothing.
func TestStalePlanRefused(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	p := plan(t, env, changed, true)
	if _, err := env.Compute.API.Sites.Update(ctx, env.RootKey, api.UpdateSite{Site: "ams1", DisplayName: ptr("Amsterdam")}); err != nil {
		t.Fatal(err)
	}
	before := export(t, env)
	_, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true})
	if code, d := codeOf(err); code != api.CodeFailedPrecondition || d["reason"] != fleetconfig.ReasonStalePlan || d["planned"] != p.Fingerprint || d["live"] != before.Fingerprint {
		t.Fatalf("apply of a stale plan = %v, want failed_precondition stale_plan", err)
	}
	if after := export(t, env); after.Document != before.Document {
		t.Fatalf("a refused apply wrote:\n%s", after.Document)
	}
	// Counters are not the state: a plan stays good while a quota's use changes.
	p = plan(t, env, changed, true)
	if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.quotas SET used = used + 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true}); err != nil {
		t.Fatalf("apply after a change of use only: %v", err)
	}
}

// TestConcurrentAppliesOneWins: two applies of one plan at once: one applies, the other waits
// for it and then finds the plan stale.
func TestConcurrentAppliesOneWins(t *testing.T) {
	t.Parallel()
	env := built(t)
	p := plan(t, env, changed, true)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := env.Compute.API.Fleet.Apply(context.Background(), env.RootKey, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true})
			errs <- err
		}()
	}
	var ok, stale int
	for range 2 {
		err := <-errs
		switch code, d := codeOf(err); {
		case err == nil:
			ok++
		case code == api.CodeFailedPrecondition && d["reason"] == fleetconfig.ReasonStalePlan:
			stale++
		default:
			t.Fatalf("apply = %v", err)
		}
	}
	if ok != 1 || stale != 1 {
		t.Fatalf("%d applied and %d were stale, want 1 and 1", ok, stale)
	}
}

// TestBadDocumentsWriteNothing: bad YAML, unknown fields, invalid values and references to
// nothing are refused with invalid_argument naming the path (or failed_precondition for what
// the API cannot do), by plan and apply alike, and nothing is written.
func TestBadDocumentsWriteNothing(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	good := plan(t, env, changed, true).Fingerprint
	before := export(t, env)
	cases := []struct {
		name, doc string
		code      api.Code
		field     string
	}{
		{"not YAML", strings.Replace(changed, "  sites:\n", "  sites: [\n", 1), api.CodeInvalidArgument, "document"},
		{"unknown field", strings.Replace(changed, "    labels: {tier: silver}", "    lables: {tier: silver}", 1), api.CodeInvalidArgument, "spec.pools[2].lables"},
		{"invalid value", strings.Replace(changed, "limit: 4}", "limit: -4}", 1), api.CodeInvalidArgument, "spec.quotas[2].limit"},
		{"no such site", strings.Replace(changed, "site: par1", "site: lon1", 1), api.CodeInvalidArgument, "spec.pools[2].site"},
		{"no such pool", strings.Replace(changed, "pool: l40s", "pool: v100", 1), api.CodeInvalidArgument, "spec.quotas[2].pool"},
		{"quota of a tenant outside", strings.Replace(changed, "{tenant: t1, pool: l40s", "{tenant: elsewhere, pool: l40s", 1), api.CodeInvalidArgument, "spec.quotas[2].tenant"},
		{"a quota twice", strings.Replace(changed, "{pool: cpu,", "{tenant: t1, pool: h100, resource: gpus, model: h100, limit: 1}\n  - {pool: cpu,", 1), api.CodeInvalidArgument, "spec.quotas[1]"},
		{"a quota twice, once by default", strings.Replace(changed, "{pool: cpu, resource: vcpus, limit: 0}", "{pool: cpu, resource: vcpus, limit: 0}\n  - {tenant: root, pool: cpu, resource: vcpus, limit: 2}", 1), api.CodeInvalidArgument, "spec.quotas[2]"},
		{"a pool moved", strings.Replace(changed, "  - name: a100\n    site: ams1", "  - name: a100\n    site: fra1", 1), api.CodeFailedPrecondition, "spec.pools[1].site"},
		{"another tenant's document", strings.Replace(changed, "kind: FleetConfig\n", "kind: FleetConfig\nmetadata: {tenant: t1}\n", 1), api.CodeInvalidArgument, "tenantId"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := api.PlanFleet{Document: c.doc, Prune: true}
			if c.field == "tenantId" {
				in.TenantID = computetest.RootTenantID
			}
			_, perr := env.Compute.API.Fleet.Plan(ctx, env.RootKey, in)
			_, aerr := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{TenantID: in.TenantID, Document: c.doc, Fingerprint: good, Prune: true})
			for name, err := range map[string]error{"plan": perr, "apply": aerr} {
				code, d := codeOf(err)
				if code != c.code || d["field"] != c.field {
					t.Errorf("%s = %v (field %v), want %s naming %s", name, err, d["field"], c.code, c.field)
				}
			}
		})
	}
	if after := export(t, env); after.Document != before.Document {
		t.Fatalf("refused documents wrote:\n%s", after.Document)
	}
	var n int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.fleet_configs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d documents recorded (%v), want none", n, err)
	}
}

// TestApplyIsAtomic: a change that fails half-way through an apply (a pruned pool that still
// has a node; an endpoint the server refuses after sites and pools were created) fails the
// whole apply with the failing change named, and leaves the state as it was.
func TestApplyIsAtomic(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	a100, err := env.Compute.API.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: "a100"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: a100.ID, Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	before := export(t, env)
	noA100 := strings.Replace(changed, "  - name: a100\n    site: ams1\n", "", 1)
	p := plan(t, env, noA100, true)
	if p.Changes[len(p.Changes)-1].Key != "a100" {
		t.Fatalf("the plan does not end deleting a100: %+v", p.Changes)
	}
	_, err = env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: noA100, Fingerprint: p.Fingerprint, Prune: true})
	code, d := codeOf(err)
	if change, _ := d["change"].(map[string]any); code != api.CodeFailedPrecondition || d["reason"] != "pool_has_nodes" || change["key"] != "a100" {
		t.Fatalf("apply pruning a pool with a node = %v (%v)", err, d)
	}
	if after := export(t, env); after.Document != before.Document {
		t.Fatalf("a failed apply left changes:\n%s\nwas:\n%s", after.Document, before.Document)
	}

	private := strings.Replace(changed, "https://hooks.example.com/compute", "https://192.0.2.1/hook", 1)
	p = plan(t, env, private, true)
	_, err = env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: private, Fingerprint: p.Fingerprint, Prune: true})
	if code, d := codeOf(err); code != api.CodeInvalidArgument || d["field"] != "spec.webhooks[0].url" {
		t.Fatalf("apply with an endpoint at a documentation address = %v (%v), want invalid_argument naming spec.webhooks[0].url", err, d)
	}
	if after := export(t, env); after.Document != before.Document {
		t.Fatalf("a failed apply left changes:\n%s", after.Document)
	}
}

// TestOneDecisionPerApply: an apply of many changes asks IAM once, for compute:fleet:apply in
// the document's tenant; none of the methods it runs decides again.
func TestOneDecisionPerApply(t *testing.T) {
	t.Parallel()
	env := built(t)
	p := plan(t, env, changed, true)
	env.Counter.Reset()
	if _, err := env.Compute.API.Fleet.Apply(context.Background(), env.RootKey, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true}); err != nil {
		t.Fatal(err)
	}
	ds := env.Counter.Decisions()
	if len(ds) != 1 || ds[0].Action != "compute:fleet:apply" || ds[0].TenantID != computetest.RootTenantID || ds[0].Resource.Type != api.ResourceFleet {
		t.Fatalf("decisions = %+v, want one compute:fleet:apply in root", ds)
	}
}

// TestApplyNeedsItsPermission: a key that may plan but not apply is refused, as is a tenant's
// administrator applying its parent's document; neither writes anything.
func TestApplyNeedsItsPermission(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	ident, err := env.IAM.CreateIdentity(ctx, computetest.RootTenantID, iam.KindService, "planner")
	if err != nil {
		t.Fatal(err)
	}
	role, err := env.IAM.CreateRole(ctx, computetest.RootTenantID, "planner", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:fleet:plan", "compute:fleet:export"}, Resources: []string{"*"}}}})
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
	before := export(t, env)
	p, err := env.Compute.API.Fleet.Plan(ctx, key.Token, api.PlanFleet{Document: changed, Prune: true})
	if err != nil {
		t.Fatalf("the planner may plan: %v", err)
	}
	_, err = env.Compute.API.Fleet.Apply(ctx, key.Token, api.ApplyFleet{Document: changed, Fingerprint: p.Fingerprint, Prune: true})
	if code, d := codeOf(err); code != api.CodePermissionDenied || d["action"] != "compute:fleet:apply" {
		t.Fatalf("the planner's apply = %v", err)
	}
	k, err := env.IAM.CreateAdminKey(ctx, "t1", "t1-admin")
	if err != nil {
		t.Fatal(err)
	}
	t1Key := k.Token
	rootDoc := strings.Replace(changed, "kind: FleetConfig\n", "kind: FleetConfig\nmetadata: {tenant: root}\n", 1)
	_, err = env.Compute.API.Fleet.Apply(ctx, t1Key, api.ApplyFleet{Document: rootDoc, Fingerprint: p.Fingerprint, Prune: true})
	if code, _ := codeOf(err); code != api.CodePermissionDenied {
		t.Fatalf("t1 applying root's document = %v, want permission_denied", err)
	}
	if _, err := env.Compute.API.Fleet.Export(ctx, t1Key, api.ExportFleet{TenantID: computetest.RootTenantID}); err == nil {
		t.Fatal("t1 exported root's fleet")
	}
	if after := export(t, env); after.Document != before.Document {
		t.Fatalf("refused applies wrote:\n%s", after.Document)
	}
	// Its own fleet, t1 may apply: an empty one, which manages its sites.
	own := "apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [sites]\n  sites: [{name: t1-site}]\n"
	tp, err := env.Compute.API.Fleet.Plan(ctx, t1Key, api.PlanFleet{Document: own})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Fleet.Apply(ctx, t1Key, api.ApplyFleet{Document: own, Fingerprint: tp.Fingerprint}); err != nil {
		t.Fatalf("t1 applying its own document: %v", err)
	}
	if s, err := env.Compute.API.Sites.Get(ctx, t1Key, api.GetSite{Site: "t1-site"}); err != nil || s.TenantID != "t1" {
		t.Fatalf("t1's site = %+v, %v", s, err)
	}
}

func events(t *testing.T, env *computetest.Env, typ string) []map[string]any {
	t.Helper()
	rows, err := env.DB.Pool.Query(context.Background(), `SELECT data FROM compute.events WHERE type = $1 ORDER BY id`, typ)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var d map[string]any
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// TestDriftEventedOnce: once a document is applied, a change made outside it is drift: the
// check emits fleet.drifted once, however often it runs, again when the drift changes, and
// fleet.converged once it is gone; fleet.drift shows the drift now, field by field.
func TestDriftEventedOnce(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	rt := env.Compute.Runtime()
	x := export(t, env)
	if _, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: x.Document, Fingerprint: x.Fingerprint, Prune: true}); err != nil {
		t.Fatal(err)
	}
	check := func(want int) {
		t.Helper()
		n, err := fleetconfig.CheckDrift(ctx, rt)
		if err != nil || n != want {
			t.Fatalf("CheckDrift = %d, %v; want %d events", n, err, want)
		}
	}
	check(0)
	if _, err := env.Compute.API.Pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "cpu", Description: ptr("changed by hand")}); err != nil {
		t.Fatal(err)
	}
	check(1)
	check(0)
	check(0)
	got := events(t, env, fleetconfig.EventDrifted)
	if len(got) != 1 || got[0]["count"] != float64(1) {
		t.Fatalf("fleet.drifted events = %v", got)
	}
	rep, err := env.Compute.API.Fleet.Drift(ctx, env.RootKey, api.GetFleetDrift{})
	if err != nil {
		t.Fatal(err)
	}
	want := []api.FleetChange{{Action: "update", Kind: "pool", Key: "cpu", Path: "spec.pools[1]", Fields: []api.FieldChange{{Field: "description", Old: "changed by hand", New: ""}}}}
	if diff := cmp.Diff(want, rep.Changes); diff != "" || !rep.Drifted || rep.Applied == nil || rep.Applied.Document != x.Document {
		t.Fatalf("drift = %+v (-want +got):\n%s", rep, diff)
	}
	if _, err := env.Compute.API.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "lon1"}); err != nil {
		t.Fatal(err)
	}
	check(1) // a site the applied document (pruned) does not list: the drift changed
	got = events(t, env, fleetconfig.EventDrifted)
	if len(got) != 2 || got[1]["count"] != float64(2) {
		t.Fatalf("fleet.drifted events = %v", got)
	}
	if _, err := env.Compute.API.Sites.Delete(ctx, env.RootKey, api.DeleteSite{Site: "lon1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "cpu", Description: ptr("")}); err != nil {
		t.Fatal(err)
	}
	check(1)
	check(0)
	if c := events(t, env, fleetconfig.EventConverged); len(c) != 1 {
		t.Fatalf("fleet.converged events = %v", c)
	}
	if rep, err := env.Compute.API.Fleet.Drift(ctx, env.RootKey, api.GetFleetDrift{}); err != nil || rep.Drifted || len(rep.Changes) != 0 {
		t.Fatalf("drift after converging = %+v, %v", rep, err)
	}
}

// TestDriftJobOnRiver: the drift check runs as River's periodic job in the worker mode (once at
// start, then every period) and tells of drift with no call from anyone.
func TestDriftJobOnRiver(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Mode: compute.ModeWorker})
	ctx := context.Background()
	doc := "apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [sites]\n  sites: [{name: fra1}]\n"
	p := plan(t, env, doc, false)
	if _, err := env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: doc, Fingerprint: p.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Sites.Update(ctx, env.RootKey, api.UpdateSite{Site: "fra1", DisplayName: ptr("by hand")}); err != nil {
		t.Fatal(err)
	}
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, time.Minute, "a fleet.drifted event after the worker's start", func() bool {
		return len(events(t, env, fleetconfig.EventDrifted)) > 0
	})
}

// TestMigrationsUpDownUp: the package's schema rolls back and applies again.
func TestMigrationsUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, fleetconfig.Migrations)
	exists := func() bool {
		var ok bool
		if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('compute.fleet_configs') IS NOT NULL`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !exists() {
		t.Fatal("no compute.fleet_configs after the migrations")
	}
	if err := postgres.MigrateDown(ctx, db, fleetconfig.Migrations); err != nil || exists() {
		t.Fatalf("roll back: %v; the table is still there: %v", err, exists())
	}
	if err := postgres.Migrate(ctx, db, postgres.Core, fleetconfig.Migrations); err != nil || !exists() {
		t.Fatalf("apply again: %v", err)
	}
}

// TestExportCarriesTextStoredBefore: text the API refuses now but once accepted (U+007F, NEL,
// U+FFFE in a display name, a description, a label) still exports: fleet.export answered 500 for
// such a tenant forever. The API now refuses the same text on the way in, naming the field.
func TestExportCarriesTextStoredBefore(t *testing.T) {
	t.Parallel()
	env := built(t)
	ctx := context.Background()
	for _, q := range []string{
		`UPDATE compute.sites SET display_name = 'a' || chr(127) || 'b' WHERE name = 'fra1'`,
		`UPDATE compute.pools SET description = 'c' || chr(133) || chr(65534) WHERE name = 'h100'`,
		`UPDATE compute.sites SET labels = jsonb_build_object('region', 'e' || chr(159)) WHERE name = 'fra1'`,
	} {
		if _, err := env.DB.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	x := export(t, env)
	for _, want := range []string{`displayName: "a\x7Fb"`, `description: "c\Nx`, `region: "e\x9F"`} {
		if !strings.Contains(x.Document, strings.TrimSuffix(want, "x")) {
			t.Errorf("the export lacks %s:\n%s", want, x.Document)
		}
	}
	_, err := env.Compute.API.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "s9", DisplayName: "a\x7fb"})
	if code, details := codeOf(err); code != api.CodeInvalidArgument || details["field"] != "displayName" {
		t.Fatalf("a display name with U+007F: %v, want invalid_argument naming displayName", err)
	}
}
