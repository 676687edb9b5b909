package iam_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// contractRoutes is every route of the served contract, and one it does not have.
var contractRoutes = []string{
	"sts/getCallerIdentity", "authorize", "tenants/path", "catalog/register", "catalog/get",
	"billing/ensureMeters", "billing/record", "flags/evaluate",
	"delegations/requestConfirmation", "delegations/getConfirmation", "events/list", "no/such",
}

// FuzzContractBodies sends any body to any route of the contract, as a root service allowed
// every call. On a healthy database no answer is a 5xx; every answer is the contract's envelope
// ({"data"} or {"error": {code, message}} with a known code); and a body that was accepted is
// refused once data follows its JSON value. In the body, $AGENT stands for an agent's key and
// $CFM for a confirmation's id, so that the corpus reaches past authentication.
func FuzzContractBodies(f *testing.F) {
	ctx := context.Background()
	db := pgtest.New(f, postgres.Core, iam.Migrations)
	a, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1})
	if err != nil {
		f.Fatal(err)
	}
	if err := a.Initialize(ctx); err != nil {
		f.Fatal(err)
	}
	svc, err := a.CreateAdminKey(ctx, "root", "svc")
	if err != nil {
		f.Fatal(err)
	}
	ada, _ := a.CreateIdentity(ctx, "root", iam.KindUser, "ada")
	bot, _ := a.CreateIdentity(ctx, "root", iam.KindAgent, "bot")
	role, _ := a.CreateRole(ctx, "root", "pools", allow("compute:pools:*"))
	if err := a.Bind(ctx, bot.ID, role.ID, "root"); err != nil {
		f.Fatal(err)
	}
	if _, err := a.CreateDelegation(ctx, "root", ada.ID, bot.ID, []string{"compute:pools:delete"}); err != nil {
		f.Fatal(err)
	}
	agentKey, err := a.CreateAPIKey(ctx, bot.ID, "", time.Time{})
	if err != nil {
		f.Fatal(err)
	}
	botP, _ := a.Authenticate(ctx, agentKey.Token)
	cfm, err := a.RequestConfirmation(ctx, botP, pool("root", "compute:pools:delete"))
	if err != nil {
		f.Fatal(err)
	}
	if err := a.EnsureMeters(ctx, []iam.Meter{{Key: "gpu.h100.hours", Unit: "hour"}}); err != nil {
		f.Fatal(err)
	}
	if err := a.SetFlag(ctx, "compute.spot", true, ""); err != nil {
		f.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	f.Cleanup(srv.Close)

	for _, s := range []struct {
		route int
		body  string
	}{
		{0, `{}`}, {0, ``}, {0, `{"x":1}`},
		{1, `{"credential":"$AGENT","request":{"tenantId":"root","action":"compute:pools:list","resource":{"type":"compute-pool","id":"p1"}}}`},
		{1, `{"credential":"$AGENT","requests":[{"tenantId":"root","action":"compute:pools:delete","resource":{"type":"compute-pool","id":"*"},"method":"pools.delete","input":{"gpus":1}}]}`},
		{1, `{"credential":"$AGENT","request":{"tenantId":"no\u0000pe","action":"a","resource":{"type":"t","id":"i"},"context":{"request.ip":"::1"}}}`},
		{1, `{"credential":"biam_key_x"}`}, {1, `{"credential":"$AGENT","requests":[]}`},
		{2, `{"tenantId":"root"}`}, {2, `{"tenantId":"\u0000"}`}, {2, `{"tenantId":1}`}, {2, `[]`},
		{3, `{"resourceTypes":[{"name":"compute-pool"}],"actions":[{"name":"compute:pools:list","resourceType":"compute-pool"}]}`},
		{3, `{"resourceTypes":[{"name":"a\u0000"}],"actions":null}`},
		{4, `{}`}, {4, `{} {}`},
		{5, `{"meters":[{"key":"gpu.a100.hours","unit":"hour"}]}`}, {5, `{"meters":[{"key":"gpu.x.hours","unit":"\u0000"}]}`},
		{6, `{"tenantId":"root","meter":"gpu.h100.hours","quantity":1.5,"occurredAt":"2026-01-01T00:00:00Z","idempotencyKey":"k1"}`},
		{6, `{"tenantId":"root","meter":"gpu.h100.hours","quantity":1e308,"occurredAt":"9999-12-31T23:59:59Z","idempotencyKey":"k2","tags":{"a":"\u0000"}}`},
		{6, `{"tenantId":"root","meter":"gpu.h100.hours","quantity":1,"occurredAt":"0001-01-01T00:00:01Z","idempotencyKey":"\u0000"}`},
		{7, `{"tenantId":"root","key":"compute.spot"}`}, {7, `{"tenantId":"root","key":"\u0000"}`},
		{8, `{"credential":"$AGENT","request":{"tenantId":"root","action":"compute:pools:delete","resource":{"type":"compute-pool","id":"p2"},"method":"pools.delete","input":{"pool":"p2"}}}`},
		{8, `{"credential":"$AGENT","request":{"tenantId":"root","action":"compute:pools:delete","resource":{"type":"compute-pool","id":"p2"},"input":"\u0000"}}`},
		{9, `{"id":"$CFM"}`}, {9, `{"id":"\u0000"}`},
		{10, `{"after":0,"limit":5}`}, {10, `{"after":-1}`}, {10, `{"after":9223372036854775807,"limit":-3}`}, {10, `{"after":1e30}`},
		{11, `{}`},
	} {
		f.Add(uint8(s.route), s.body)
	}
	f.Fuzz(func(t *testing.T, r uint8, body string) {
		route := contractRoutes[int(r)%len(contractRoutes)]
		body = strings.NewReplacer("$AGENT", agentKey.Token, "$CFM", cfm.ID).Replace(body)
		bearer := svc.Token
		if route == "sts/getCallerIdentity" && strings.Contains(body, "agent") {
			bearer = agentKey.Token
		}
		status := postContract(t, srv.URL, route, bearer, body)
		if status == http.StatusOK && strings.TrimSpace(body) != "" { // no body at all is a route's empty input
			if again := postContract(t, srv.URL, route, bearer, body+` {}`); again != http.StatusBadRequest {
				t.Fatalf("%s accepted %q followed by more data: %d", route, body, again)
			}
		}
	})
}

// postContract sends one request and checks the answer is the contract's envelope, never a 5xx.
func postContract(t *testing.T, url, route, bearer, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+iam.BasePath+route, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Better-IAM", "1")
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(resp.Body)
	var env map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw.Bytes()))
	if err := dec.Decode(&env); err != nil || dec.More() || len(env) != 1 {
		t.Fatalf("%s %q answered %d %q: not one envelope", route, body, resp.StatusCode, raw.String())
	}
	if resp.StatusCode >= 500 {
		t.Fatalf("%s %q answered %d %s", route, body, resp.StatusCode, raw.String())
	}
	if e, ok := env["error"]; ok {
		var ee struct {
			Code, Message string
		}
		if err := json.Unmarshal(e, &ee); err != nil || ee.Message == "" || !strings.Contains(" "+iam.HTTPUnauthenticated+" "+iam.HTTPAccessDenied+" "+
			iam.HTTPInvalidRequest+" "+iam.HTTPNotFound+" ", " "+ee.Code+" ") || resp.StatusCode == http.StatusOK {
			t.Fatalf("%s %q answered %d with error %s", route, body, resp.StatusCode, e)
		}
	} else if _, ok := env["data"]; !ok || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %q answered %d %s", route, body, resp.StatusCode, raw.String())
	}
	return resp.StatusCode
}
