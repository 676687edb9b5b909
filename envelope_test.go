package compute_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/webhooks"
)

func newEnv(t *testing.T) *computetest.Env {
	t.Helper()
	return computetest.New(t, computetest.Options{})
}

// call is one HTTP request to the API and what came back.
type call struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

func (c call) errCode() string {
	e, _ := c.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (c call) errDetail(k string) any {
	e, _ := c.body["error"].(map[string]any)
	d, _ := e["details"].(map[string]any)
	return d[k]
}

func do(t *testing.T, method, url, key string, body string, headers ...string) call {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	c := call{status: resp.StatusCode, header: resp.Header, raw: raw}
	if err := json.Unmarshal(raw, &c.body); err != nil {
		t.Fatalf("%s %s answered %d with a body that is not a JSON object: %q", method, url, resp.StatusCode, raw)
	}
	return c
}

func post(t *testing.T, base, key, method string, body string) call {
	t.Helper()
	return do(t, http.MethodPost, base+api.BasePath+"/"+method, key, body)
}

func TestEnvelopeErrors(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	url := env.Server(t)
	ctx := context.Background()

	// A key that may only read: its mutations are denied.
	ident, err := env.IAM.CreateIdentity(ctx, computetest.RootTenantID, iam.KindService, "reader")
	if err != nil {
		t.Fatal(err)
	}
	role, err := env.IAM.CreateRole(ctx, computetest.RootTenantID, "reader", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:*:get", "compute:*:list"}, Resources: []string{"*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.IAM.Bind(ctx, ident.ID, role.ID, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	readKey, err := env.IAM.CreateAPIKey(ctx, ident.ID, "r", zeroTime)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := env.IAM.CreateAPIKey(ctx, ident.ID, "gone", zeroTime)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.IAM.RevokeAPIKey(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	badChecksum := env.RootKey[:len(env.RootKey)-1] + flip(env.RootKey[len(env.RootKey)-1])
	unknownKey := iam.NewToken(iam.TokenAPIKey)

	big := `{"name": "x", "description": "` + strings.Repeat("a", 2<<20) + `"}`
	cases := []struct {
		name       string
		method     string // HTTP method
		path       string
		key        string
		body       string
		status     int
		code       api.Code
		reason     string
		detailKey  string
		detailWant any
	}{
		{"unknown group", "POST", "/nosuch/create", env.RootKey, `{}`, 404, api.CodeNotFound, "unknown_method", "group", "nosuch"},
		{"unknown method", "POST", "/pools/explode", env.RootKey, `{}`, 404, api.CodeNotFound, "unknown_method", "method", "explode"},
		{"no method", "POST", "/pools", env.RootKey, `{}`, 404, api.CodeNotFound, "unknown_method", "", nil},
		{"a GET", "GET", "/pools/create", env.RootKey, ``, 405, api.CodeInvalidArgument, "method_not_allowed", "", nil},
		{"body not JSON", "POST", "/pools/create", env.RootKey, `{"name": `, 400, api.CodeInvalidArgument, "invalid_json", "", nil},
		{"body is JSON but not an object", "POST", "/pools/create", env.RootKey, `[1, 2]`, 400, api.CodeInvalidArgument, "invalid_json", "", nil},
		{"trailing data", "POST", "/pools/create", env.RootKey, `{"name": "a"} {}`, 400, api.CodeInvalidArgument, "invalid_json", "", nil},
		{"unknown field", "POST", "/pools/create", env.RootKey, `{"name": "a", "colour": "red"}`, 400, api.CodeInvalidArgument, "unknown_field", "field", "colour"},
		{"wrong type", "POST", "/pools/create", env.RootKey, `{"name": 7}`, 400, api.CodeInvalidArgument, "wrong_type", "field", "name"},
		{"bad name", "POST", "/pools/create", env.RootKey, `{"name": "Not A Name"}`, 400, api.CodeInvalidArgument, "", "field", "name"},
		{"body too large", "POST", "/pools/create", env.RootKey, big, 413, api.CodeInvalidArgument, "body_too_large", "", nil},
		{"no credential", "POST", "/pools/create", "", `{"name": "a"}`, 401, api.CodeUnauthenticated, "missing_credential", "", nil},
		{"not a token", "POST", "/pools/create", "hunter2", `{"name": "a"}`, 401, api.CodeUnauthenticated, "invalid_credential", "", nil},
		{"bad checksum", "POST", "/pools/create", badChecksum, `{"name": "a"}`, 401, api.CodeUnauthenticated, "invalid_credential", "", nil},
		{"unknown key", "POST", "/pools/create", unknownKey, `{"name": "a"}`, 401, api.CodeUnauthenticated, "invalid_credential", "", nil},
		{"revoked key", "POST", "/pools/create", revoked.Token, `{"name": "a"}`, 401, api.CodeUnauthenticated, "invalid_credential", "", nil},
		{"denied", "POST", "/pools/create", readKey.Token, `{"name": "a"}`, 403, api.CodePermissionDenied, "", "action", "compute:pools:create"},
		{"tenant outside", "POST", "/pools/create", env.RootKey, `{"name": "a", "tenantId": "elsewhere"}`, 403, api.CodePermissionDenied, "tenant", "tenantId", "elsewhere"},
		{"bad limit", "POST", "/pools/list", env.RootKey, `{"limit": 100000}`, 400, api.CodeInvalidArgument, "", "field", "limit"},
		{"bad cursor", "POST", "/pools/list", env.RootKey, `{"cursor": "garbage"}`, 400, api.CodeInvalidArgument, "", "field", "cursor"},
		{"missing pool", "POST", "/pools/get", env.RootKey, `{"pool": "nope"}`, 404, api.CodeNotFound, "", "ref", "nope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := do(t, tc.method, url+api.BasePath+tc.path, tc.key, tc.body)
			if c.status != tc.status || c.errCode() != string(tc.code) {
				t.Fatalf("answered %d %s, want %d %s: %s", c.status, c.errCode(), tc.status, tc.code, c.raw)
			}
			if tc.reason != "" && c.errDetail("reason") != tc.reason {
				t.Fatalf("reason %v, want %q: %s", c.errDetail("reason"), tc.reason, c.raw)
			}
			if tc.detailKey != "" && c.errDetail(tc.detailKey) != tc.detailWant {
				t.Fatalf("details.%s = %v, want %v: %s", tc.detailKey, c.errDetail(tc.detailKey), tc.detailWant, c.raw)
			}
			if msg, _ := c.body["error"].(map[string]any)["message"].(string); msg == "" {
				t.Fatalf("error without a message: %s", c.raw)
			}
		})
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.pools"); n != 0 {
		t.Fatalf("refused calls created %d pools", n)
	}
}

func TestMethodTableRoute(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	c := do(t, http.MethodGet, env.Server(t)+api.BasePath+"/methods", "", "")
	if c.status != 200 {
		t.Fatalf("GET methods = %d %s", c.status, c.raw)
	}
	var table struct{ Methods []api.MethodInfo }
	if err := json.Unmarshal(c.raw, &table); err != nil {
		t.Fatal(err)
	}
	byName := cmpopts.SortSlices(func(a, b api.MethodInfo) bool { return a.FullName() < b.FullName() })
	if diff := cmp.Diff(api.Methods(), table.Methods, byName); diff != "" {
		t.Fatalf("the method table route differs from api.Methods (-want +got):\n%s", diff)
	}
}

// aDelivery gives webhook a delivery, as the workers would: an event of its tenant, sequenced
// and fanned out.
func aDelivery(t *testing.T, env *computetest.Env, webhook string) int64 {
	t.Helper()
	ctx := context.Background()
	if err := events.Emit(ctx, env.DB.Pool, "test.delivered", computetest.RootTenantID, "x", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Sequence(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	if _, err := webhooks.Fanout(ctx, env.DB, env.Compute.Runtime().Jobs); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := env.DB.Pool.QueryRow(ctx, `SELECT max(id) FROM compute.webhook_deliveries WHERE endpoint_id = $1`, webhook).Scan(&id); err != nil {
		t.Fatalf("no delivery for webhook %s: %v", webhook, err)
	}
	return id
}

// aRun is a running workflow run of the root tenant, written as the engine writes one.
func aRun(t *testing.T, env *computetest.Env) string {
	t.Helper()
	id := "0190a0b0-0000-7000-8000-0000000000aa"
	if _, err := env.DB.Pool.Exec(context.Background(), `WITH r AS (INSERT INTO compute.workflow_runs (id, workflow, tenant_id) VALUES ($1, 'test.flow', $2) RETURNING id)
		INSERT INTO compute.workflow_steps (run_id, n, name) SELECT id, 0, 'only' FROM r`, id, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	return id
}

// anApproval is a pending approval of the root tenant that another principal asked for, written
// as the quorum gate writes one.
func anApproval(t *testing.T, env *computetest.Env) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	if _, err := env.DB.Pool.Exec(context.Background(), `INSERT INTO compute.approvals (id, tenant_id, method, digest, targets, params, reason, requested_by, approvers, state, created_at, expires_at)
		VALUES ($1, $2, 'nodes.drainMany', sha256('x'), '{}', '{}', 'test', 'idn_someone_else', 1, 'pending', now(), now() + interval '1 hour')`, id, computetest.RootTenantID); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestOneDecisionPerMutation checks that every mutating method of the core table asks IAM
// exactly once, with its own action and in the caller's tenant, and that repeated reads are served
// from the decision cache. A mutating method added to the table without a step here fails it.
func TestOneDecisionPerMutation(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env := ff.env
	url := env.Server(t)
	ids := map[string]string{} // the ids earlier steps answered, by step name
	rel := newReleaseSigner(t)
	future := time.Now().Add(3 * time.Hour).UTC().Format(time.RFC3339)
	steps := []struct {
		method   string
		body     func() string
		wildcard bool // creates decide on "*": the resource has no id yet
	}{
		{"sites/create", fixed(`{"name": "fra1"}`), true},
		{"sites/update", fixed(`{"site": "fra1", "labels": {"region": "eu"}}`), false},
		{"pools/create", fixed(`{"name": "h100", "site": "fra1"}`), true},
		{"pools/update", fixed(`{"pool": "h100", "description": "eight H100s a node"}`), false},
		{"pools/delete", fixed(`{"pool": "h100"}`), false},
		{"sites/delete", fixed(`{"site": "fra1"}`), false},
		{"quotas/set", fixed(`{"tenantId": "t1", "pool": "p1", "resource": "gpus", "limit": 4}`), false},
		{"quotas/delete", fixed(`{"tenantId": "t1", "pool": "p1", "resource": "gpus"}`), false},
		{"nodes/setLabels", fixed(`{"node": "n1", "pool": "p1", "labels": {"zone": "z1"}}`), false},
		{"nodes/cordon", fixed(`{"node": "n1", "pool": "p1"}`), false},
		{"nodes/uncordon", fixed(`{"node": "n1", "pool": "p1"}`), false},
		{"devices/setMode", fixed(`{"device": "GPU-n1-7", "mode": "timeslice", "shares": 4}`), false},
		{"reservations/create", fixed(`{"pool": "p1", "gpus": 1, "duration": "1h"}`), true},
		{"reservations/extend", func() string {
			return `{"reservation": "` + ids["reservations/create"] + `", "end": "` + future + `"}`
		}, false},
		{"access/sshCA", fixed(`{}`), true},
		{"access/sshCertificate", func() string {
			return `{"reservation": "` + ids["reservations/create"] + `", "publicKey": "` + fuzzSSHKey + `"}`
		}, true},
		{"access/revoke", func() string { return `{"serial": ` + ids["access/sshCertificate.serial"] + `}` }, true},
		{"access/exec", func() string {
			return `{"reservation": "` + ids["reservations/create"] + `", "command": ["true"]}`
		}, false},
		// The node's console is its operators' (and a whole holder's): a holder of one GPU is refused it.
		{"access/console", func() string { return `{"node": "` + ff.nodeID + `"}` }, false},
		{"reservations/release", func() string { return `{"reservation": "` + ids["reservations/create"] + `"}` }, false},
		{"reservations/create", fixed(`{"pool": "p1", "gpus": 1, "start": "2030-01-01T00:00:00Z", "duration": "1h"}`), true},
		{"reservations/cancel", func() string { return `{"reservation": "` + ids["reservations/create"] + `"}` }, false},
		{"joinTokens/create", fixed(`{"pool": "p1", "ttl": "1h"}`), true},
		{"joinTokens/revoke", func() string { return `{"token": "` + ids["joinTokens/create"] + `"}` }, false},
		{"commands/create", func() string {
			return `{"node": "` + ff.nodeID + `", "kind": "gpu.reset", "args": {"gpu": 0}, "deadline": "1m"}`
		}, true},
		{"commands/cancel", func() string { return `{"command": "` + ids["commands/create"] + `"}` }, false},
		{"webhooks/create", fixed(`{"url": "https://hooks.example.com/compute"}`), true},
		{"webhooks/rotateSecret", func() string { return `{"webhook": "` + ids["webhooks/create"] + `"}` }, false},
		{"webhooks/test", func() string { return `{"webhook": "` + ids["webhooks/create"] + `"}` }, false},
		{"webhooks/redeliver", func() string {
			return fmt.Sprintf(`{"delivery": %d}`, aDelivery(t, env, ids["webhooks/create"]))
		}, false},
		{"webhooks/delete", func() string { return `{"webhook": "` + ids["webhooks/create"] + `"}` }, false},
		{"workflows/cancel", func() string { return `{"run": "` + aRun(t, env) + `"}` }, false},
		{"fleet/apply", func() string {
			// The plan's own (read) decision is not the apply's: count from here.
			doc := `apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [sites]\n  sites: [{name: s1}, {name: fra2}]\n`
			p := post(t, url, env.RootKey, "fleet/plan", `{"document": "`+doc+`"}`)
			if p.status != 200 {
				t.Fatalf("fleet/plan = %d %s", p.status, p.raw)
			}
			env.Counter.Reset()
			return `{"document": "` + doc + `", "fingerprint": "` + p.body["fingerprint"].(string) + `"}`
		}, true},
		{"nodes/drainMany", fixed(`{"pool": "p1", "nodes": ["n1"], "end": true}`), true},
		{"releases/setRoot", func() string { return rel.rootBody(t) }, true},
		{"releases/upload", fixed(rel.uploadBody()), true},
		{"releases/publish", func() string { return rel.publishBody(t, url, ids["releases/upload.url"]) }, true},
		{"rollouts/create", fixed(`{"pool": "p1", "release": "v1.0.0", "maxUnavailable": 1}`), true},
		{"rollouts/pause", func() string { return `{"rollout": "` + ids["rollouts/create"] + `"}` }, false},
		{"rollouts/resume", func() string { return `{"rollout": "` + ids["rollouts/create"] + `"}` }, false},
		{"rollouts/rollback", func() string { return `{"rollout": "` + ids["rollouts/create"] + `"}` }, false},
		{"nodes/drain", fixed(`{"node": "n1", "pool": "p1"}`), false},
		{"nodes/retireMany", fixed(`{"pool": "p1", "nodes": ["n1"]}`), true},
		{"nodes/retire", func() string { return `{"node": "` + ff.nodeID + `"}` }, false},
		{"quorum/set", fixed(`{"maxNodes": 10, "maxPercent": 50, "approvers": 1, "ttl": "2h"}`), true},
		{"approvals/approve", func() string { return `{"approval": "` + anApproval(t, env) + `"}` }, false},
		{"approvals/deny", func() string { return `{"approval": "` + anApproval(t, env) + `", "comment": "no"}` }, false},
	}
	covered := map[string]bool{}
	for _, s := range steps {
		env.Counter.Reset()
		c := post(t, url, env.RootKey, s.method, s.body())
		if c.status != 200 {
			t.Fatalf("%s = %d %s", s.method, c.status, c.raw)
		}
		if id, ok := c.body["id"].(string); ok {
			ids[s.method] = id
		}
		if u, ok := c.body["url"].(string); ok {
			ids[s.method+".url"] = u
		}
		if serial, ok := c.body["serial"].(float64); ok {
			ids[s.method+".serial"] = fmt.Sprint(int64(serial))
		}
		ds := env.Counter.Decisions()
		if len(ds) != 1 {
			t.Fatalf("%s made %d IAM decisions, want exactly 1: %v", s.method, len(ds), ds)
		}
		group, name, _ := strings.Cut(s.method, "/")
		if ds[0].Action != api.Action(group, name) || ds[0].TenantID != computetest.RootTenantID {
			t.Fatalf("%s decided %+v, want action %s in the root tenant", s.method, ds[0], api.Action(group, name))
		}
		if got := ds[0].Resource.ID; s.wildcard != (got == "*") {
			t.Fatalf("%s decided on resource %q", s.method, got)
		}
		covered[group+"."+name] = true
	}
	for _, m := range api.Methods() {
		if m.Mutating && !covered[m.FullName()] {
			t.Errorf("mutating method %s has no step here", m.FullName())
		}
	}

	// Reads: the first decides, the repeats within the cache's lifetime do not.
	env.Counter.Reset()
	for range 5 {
		if c := post(t, url, env.RootKey, "pools/list", `{}`); c.status != 200 {
			t.Fatalf("pools/list = %d %s", c.status, c.raw)
		}
	}
	if n := len(env.Counter.Decisions()); n != 1 {
		t.Fatalf("5 identical reads made %d decisions, want 1 (the rest cached)", n)
	}
}

func fixed(body string) func() string { return func() string { return body } }

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	url := env.Server(t)
	first := do(t, "POST", url+api.BasePath+"/pools/create", env.RootKey, `{"name": "a100"}`, api.IdempotencyKeyHeader, "k-1")
	again := do(t, "POST", url+api.BasePath+"/pools/create", env.RootKey, `{"name": "a100"}`, api.IdempotencyKeyHeader, "k-1")
	if first.status != 200 || again.status != 200 {
		t.Fatalf("create, create again = %d, %d: %s %s", first.status, again.status, first.raw, again.raw)
	}
	if !bytes.Equal(bytes.TrimSpace(first.raw), bytes.TrimSpace(again.raw)) {
		t.Fatalf("the repeat answered differently:\n%s\n%s", first.raw, again.raw)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the repeat is not marked as replayed")
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.pools"); n != 1 {
		t.Fatalf("two calls with one idempotency key made %d pools, want 1", n)
	}
	other := do(t, "POST", url+api.BasePath+"/pools/create", env.RootKey, `{"name": "b100"}`, api.IdempotencyKeyHeader, "k-1")
	if other.status != 409 || other.errDetail("reason") != "idempotency_key_reused" {
		t.Fatalf("the key with another input = %d %s, want 409 idempotency_key_reused", other.status, other.raw)
	}

	// In-process, the same key through the context.
	ctx := api.WithIdempotencyKey(context.Background(), "k-2")
	p1, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "l40s"})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "l40s"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p1, p2); diff != "" {
		t.Fatalf("in-process repeat differs (-first +repeat):\n%s", diff)
	}
}

func flip(b byte) string {
	if b == 'A' {
		return "B"
	}
	return "A"
}

func newEnvMode(t *testing.T, mode compute.Mode) *computetest.Env {
	t.Helper()
	return computetest.New(t, computetest.Options{Mode: mode})
}
