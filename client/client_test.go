package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func code(err error) api.Code {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestEveryGroupAndTypedErrors(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	ctx := context.Background()
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Sites.Create(ctx, api.CreateSite{Name: "fra1"}); err != nil {
		t.Fatal(err)
	}
	pool, err := cl.Pools.Create(ctx, api.CreatePool{Name: "h100", Site: "fra1"})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: pool.ID, Name: "gpu-1"})
	env.DB.Pool.Exec(ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, n.ID)
	inv := capacity.Inventory{VCPUs: 32, MemoryGiB: 128}
	for g := range 8 {
		inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprint("u", g), Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559})
	}
	if err := capacity.SetInventory(ctx, env.DB.Pool, n.ID, inv); err != nil {
		t.Fatal(err)
	}

	// One call of every group.
	if l, err := cl.Sites.List(ctx, api.ListSites{}); err != nil || len(l.Items) != 1 {
		t.Fatalf("sites.list = %+v, %v", l, err)
	}
	if l, err := cl.Nodes.List(ctx, api.ListNodes{Pool: "h100"}); err != nil || len(l.Items) != 1 {
		t.Fatalf("nodes.list = %+v, %v", l, err)
	}
	if d, err := cl.Devices.List(ctx, api.ListDevices{Node: n.ID}); err != nil || len(d) != 8 {
		t.Fatalf("devices.list = %d, %v", len(d), err)
	}
	r, err := cl.Reservations.Create(ctx, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 8}})
	if err != nil || len(r.Allocations[0].GPUs) != 8 {
		t.Fatalf("reservations.create = %+v, %v", r, err)
	}
	if s, err := cl.Capacity.Summary(ctx, api.SummarizeCapacity{Pool: "h100"}); err != nil || s.Models[0].Used != 8 {
		t.Fatalf("capacity.summary = %+v, %v", s, err)
	}
	tenant, _ := env.Tenant(t, "acme")
	if q, err := cl.Quotas.Set(ctx, api.SetQuota{TenantID: tenant, Pool: "h100", Resource: api.QuotaGPUs, Limit: 0}); err != nil || q.Limit != 0 {
		t.Fatalf("quotas.set = %+v, %v", q, err)
	}
	if jt, err := cl.JoinTokens.Create(ctx, api.CreateJoinToken{Pool: "h100"}); err != nil || !strings.HasPrefix(jt.Token, "bcjoin_") {
		t.Fatalf("joinTokens.create = %+v, %v", jt, err)
	}
	cmd, err := cl.Commands.Create(ctx, api.CreateCommand{NodeRef: api.NodeRef{Node: n.ID}, Kind: api.CommandHealthCheck})
	if err != nil || cmd.State != api.CommandPending {
		t.Fatalf("commands.create = %+v, %v", cmd, err)
	}

	// Every code a caller may branch on, as an *api.Error with its details.
	noKey, _ := client.New(url)
	badKey, _ := client.New(url, client.WithAPIKey("biam_key_nope"))
	_, acmeKey := env.Tenant(t, "acme-2")
	acme, _ := client.New(url, client.WithAPIKey(acmeKey))
	cases := []struct {
		name string
		err  error
		code api.Code
	}{
		{"invalid_argument", second(cl.Pools.Create(ctx, api.CreatePool{Name: "Bad Name"})), api.CodeInvalidArgument},
		{"unauthenticated (no key)", second(noKey.Pools.List(ctx, api.ListPools{})), api.CodeUnauthenticated},
		{"unauthenticated (bad key)", second(badKey.Pools.List(ctx, api.ListPools{})), api.CodeUnauthenticated},
		{"permission_denied", second(acme.Pools.List(ctx, api.ListPools{TenantID: "root"})), api.CodePermissionDenied},
		{"not_found", second(cl.Pools.Get(ctx, api.GetPool{Pool: "nope"})), api.CodeNotFound},
		{"conflict", second(cl.Pools.Create(ctx, api.CreatePool{Name: "h100"})), api.CodeConflict},
		{"failed_precondition", second(cl.Pools.Delete(ctx, api.DeletePool{Pool: "h100"})), api.CodeFailedPrecondition},
		{"quota_exceeded", second(acmeCall(t, url, env, tenant)), api.CodeQuotaExceeded},
	}
	for _, tc := range cases {
		if code(tc.err) != tc.code {
			t.Errorf("%s: %v, want code %s", tc.name, tc.err, tc.code)
		}
	}
	var ae *api.Error
	_, err = cl.Pools.Get(ctx, api.GetPool{Pool: "nope"})
	if !errors.As(err, &ae) || ae.Details["ref"] != "nope" {
		t.Fatalf("not_found details = %+v", ae)
	}
	methods, err := cl.Methods(ctx)
	if err != nil || len(methods) != len(api.Methods()) {
		t.Fatalf("methods = %d, %v; want %d", len(methods), err, len(api.Methods()))
	}
}

// acmeCall is a reservation by acme, whose quota in the pool is 0.
func acmeCall(t *testing.T, url string, env *computetest.Env, tenant string) (api.Reservation, error) {
	k, err := env.IAM.CreateAdminKey(context.Background(), tenant, "acme-ops")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := client.New(url, client.WithAPIKey(k.Token))
	return c.Reservations.Create(context.Background(), api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 1}})
}

func second[T any](_ T, err error) error { return err }

// TestRetriesOnlyWhereSafe: a flaky server answers 503 once. Reads are retried; a mutation
// without an idempotency key is not; with one it is.
func TestRetriesOnlyWhereSafe(t *testing.T) {
	t.Parallel()
	var calls, fail atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if fail.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: &api.Error{Code: api.CodeUnavailable, Message: "busy"}})
			return
		}
		json.NewEncoder(w).Encode(api.Page[api.Pool]{Items: []api.Pool{}})
	}))
	defer srv.Close()
	cl, _ := client.New(srv.URL, client.WithAPIKey("k"))
	ctx := context.Background()
	try := func(name string, f func() error, wantErr bool, wantCalls int32) {
		t.Helper()
		calls.Store(0)
		fail.Store(1)
		err := f()
		if (err != nil) != wantErr || calls.Load() != wantCalls {
			t.Errorf("%s: err %v after %d calls; want error %v after %d", name, err, calls.Load(), wantErr, wantCalls)
		}
	}
	try("a read", func() error { _, err := cl.Pools.List(ctx, api.ListPools{}); return err }, false, 2)
	try("a mutation without a key", func() error { _, err := cl.Pools.Create(ctx, api.CreatePool{Name: "x"}); return err }, true, 1)
	try("a mutation with a key", func() error {
		_, err := cl.Pools.Create(api.WithIdempotencyKey(ctx, "k1"), api.CreatePool{Name: "x"})
		return err
	}, false, 2)
}

func TestContextDeadline(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	cl, _ := client.New(srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := cl.Pools.List(ctx, api.ListPools{})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 4*time.Second {
		t.Fatalf("a call past its deadline = %v after %s", err, time.Since(start))
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "compute.example.com", "ftp://x", "http://"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) succeeded", u)
		}
	}
}
