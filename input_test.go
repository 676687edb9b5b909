package compute_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

// TestBadInputNamesTheFieldAndChangesNothing: what once reached the database as a 500 or a 503
// (NUL bytes, integers past int4, a year-9999 window, unknown enum values, a bad idempotency
// key) is invalid_argument naming the field, and nothing is written.
func TestBadInputNamesTheFieldAndChangesNothing(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	url := ff.env.Server(t)
	cases := []struct {
		name, method, body, field string
		headers                   []string
	}{
		{"NUL in a name", "sites/create", `{"name":"s\u0000"}`, "name", nil},
		{"NUL in a display name", "sites/create", `{"name":"s3","displayName":"a\u0000b"}`, "displayName", nil},
		{"DEL in a display name", "sites/create", `{"name":"s3","displayName":"a\u007fb"}`, "displayName", nil},
		{"NEL in a description", "pools/create", `{"name":"p3","description":"a\u0085b"}`, "description", nil},
		{"an escape sequence in a label value", "pools/create", `{"name":"p3","labels":{"foo":"\u001b[2J"}}`, "labels.foo", nil},
		{"a non-character in a webhook's description", "webhooks/create", `{"url":"https://hooks.example.com/x","description":"\ufffe"}`, "description", nil},
		{"NUL in a label value", "pools/create", `{"name":"p3","labels":{"foo":"\u0000"}}`, "labels.foo", nil},
		{"NUL in a label key", "reservations/create", `{"pool":"p1","gpus":1,"requireLabels":{"a\u0000":"b"}}`, "requireLabels", nil},
		{"NUL in the tenant", "pools/create", `{"name":"p3","tenantId":"t1\u0000"}`, "tenantId", nil},
		{"NUL in command args", "commands/create", `{"node":"` + ff.nodeID + `","kind":"health.check","args":{"why":"\u0000"}}`, "args.why", nil},
		{"a limit past int4", "quotas/set", `{"tenantId":"t1","pool":"p1","resource":"gpus","limit":2147483648}`, "limit", nil},
		{"gpus past int4", "reservations/create", `{"pool":"p1","gpus":4294967297}`, "gpus", nil},
		{"a year-9999 start", "reservations/create", `{"pool":"p1","gpus":1,"start":"9999-12-31T00:00:00Z","duration":"8h"}`, "start", nil},
		{"a year-10000 start by its offset", "reservations/create", `{"pool":"p1","gpus":1,"start":"9999-12-31T23:00:00-23:00"}`, "start", nil},
		{"a start before 1970", "reservations/create", `{"pool":"p1","gpus":1,"start":"1969-12-31T23:59:59Z","duration":"8h"}`, "start", nil},
		{"a far end", "reservations/extend", `{"reservation":"` + fuzzID + `","end":"9999-01-01T00:00:00Z"}`, "end", nil},
		{"a far search window", "capacity/search", `{"pool":"p1","start":"2030-01-01T00:00:00Z","end":"9999-12-31T00:00:00Z"}`, "end", nil},
		{"an unknown command state", "commands/list", `{"state":"NOT-A-VALUE"}`, "state", nil},
		{"an unknown reservation state", "reservations/list", `{"state":"NOT-A-VALUE"}`, "state", nil},
		{"an unknown node state", "nodes/list", `{"state":"NOT-A-VALUE"}`, "state", nil},
		{"an idempotency key that is not UTF-8", "pools/create", `{"name":"p4"}`, api.IdempotencyKeyHeader, []string{api.IdempotencyKeyHeader, "k\xff\xfe"}},
		{"an idempotency key with a control character", "pools/create", `{"name":"p4"}`, api.IdempotencyKeyHeader, []string{api.IdempotencyKeyHeader, "k\u0085"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := rowCounts(t, ff.env)
			c := do(t, http.MethodPost, url+api.BasePath+"/"+strings.Replace(tc.method, ".", "/", 1), ff.env.RootKey, tc.body, tc.headers...)
			if c.status != http.StatusBadRequest || c.errCode() != string(api.CodeInvalidArgument) || c.errDetail("field") != tc.field {
				t.Fatalf("%s %s = %d %s, want 400 invalid_argument naming %q", tc.method, tc.body, c.status, c.raw, tc.field)
			}
			if after := rowCounts(t, ff.env); after != before {
				t.Fatalf("a refused call changed the database: %v, then %v", before, after)
			}
		})
	}
	c := post(t, url, ff.env.RootKey, "commands/list", `{"state":"NOT-A-VALUE"}`)
	if allowed, _ := c.errDetail("allowed").([]any); len(allowed) != len(api.CommandStates) {
		t.Fatalf("an unknown state's error lists %v, want the allowed states %v", c.errDetail("allowed"), api.CommandStates)
	}
	if c := post(t, url, ff.env.RootKey, "reservations/list", `{}`); c.status != http.StatusOK {
		t.Fatalf("reservations/list after the refusals = %d %s", c.status, c.raw)
	}
}

func rowCounts(t *testing.T, env *computetest.Env) [5]int {
	t.Helper()
	return [5]int{computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.sites"), computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.pools"), computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.reservations"),
		computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.quotas"), computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.commands")}
}

// TestInProcessInputIsCheckedToo: the in-process API runs the same checks, with invalid UTF-8
// and NUL that JSON cannot carry, and a credential that is not text never reaches IAM.
func TestInProcessInputIsCheckedToo(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := context.Background()
	a := env.Compute.API
	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"invalid UTF-8 in a description", func() error {
			_, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p", Description: "\xff"})
			return err
		}, "description"},
		{"invalid UTF-8 in a label key", func() error {
			_, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p", Labels: map[string]string{"\xff": "v"}})
			return err
		}, "labels"},
		{"NUL in a tenant", func() error {
			_, err := a.Pools.List(ctx, env.RootKey, api.ListPools{TenantID: "\x00"})
			return err
		}, "tenantId"},
		{"an idempotency key with NUL", func() error {
			_, err := a.Pools.Create(api.WithIdempotencyKey(ctx, "k\x00"), env.RootKey, api.CreatePool{Name: "p"})
			return err
		}, api.IdempotencyKeyHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ae *api.Error
			if api.CodeOf(err) != api.CodeInvalidArgument || !asError(err, &ae) || ae.Details["field"] != tc.field {
				t.Fatalf("err = %v, want invalid_argument naming %q", err, tc.field)
			}
		})
	}
	env.Counter.Reset()
	_, err := a.Pools.List(ctx, "key\x00", api.ListPools{})
	if api.CodeOf(err) != api.CodeUnauthenticated {
		t.Fatalf("a credential with NUL = %v, want unauthenticated", err)
	}
	if n := env.Counter.Authentications(); n != 0 {
		t.Fatalf("a credential with NUL reached IAM %d times", n)
	}
}

func asError(err error, target **api.Error) bool {
	e, ok := err.(*api.Error)
	*target = e
	return ok
}

type nanOut struct {
	Value float64 `json:"value"`
}

var nanMethod = api.NewMethod[probeIn, nanOut]("probes", "nan", false, "compute-probe", "test", "Answers what JSON cannot encode.")

// TestAnswerThatCannotBeEncodedIs500: an answer that cannot be encoded is a 500 internal error
// envelope, never a 2xx with an empty body.
func TestAnswerThatCannotBeEncodedIs500(t *testing.T) {
	t.Parallel()
	mod := testModule{name: "nan", register: func(r *modules.Registry) error {
		r.ResourceTypes(iam.ResourceType{Name: "compute-probe"})
		r.Actions(modules.ActionsFor(nanMethod.Info())...)
		modules.Handle(r, nanMethod, nil, func(context.Context, *modules.Call, probeIn) (nanOut, error) {
			return nanOut{Value: math.NaN()}, nil
		})
		return nil
	}}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{mod}})
	req := httptest.NewRequest(http.MethodPost, nanMethod.Path(), strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+env.RootKey)
	rec := httptest.NewRecorder()
	env.Compute.Handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Fatalf("an answer with NaN = %d %q, want a 500 internal error envelope", rec.Code, rec.Body.String())
	}
}

// TestExtendNeverPassesMaxTime: extending by a duration, again and again, stops at api.MaxTime
// with invalid_argument naming by, so every answer and list stays encodable.
func TestExtendNeverPassesMaxTime(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	url := ff.env.Server(t)
	ctx := context.Background()
	start := api.MaxTime.Add(-24 * time.Hour)
	r, err := ff.env.Compute.API.Reservations.Create(ctx, ff.env.RootKey, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 1}, Start: &start, Duration: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	var last error
	for range 20 {
		_, last = ff.env.Compute.API.Reservations.Extend(ctx, ff.env.RootKey, api.ExtendReservation{Reservation: r.ID, By: "876000h"})
		if last != nil {
			break
		}
	}
	var ae *api.Error
	if !asError(last, &ae) || ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "by" {
		t.Fatalf("extending past %s = %v, want invalid_argument naming by", api.MaxTime, last)
	}
	c := post(t, url, ff.env.RootKey, "reservations/list", `{}`)
	if items, _ := c.body["items"].([]any); c.status != http.StatusOK || len(items) != 1 {
		t.Fatalf("reservations/list = %d %s", c.status, c.raw)
	}
}
