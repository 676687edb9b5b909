package compute_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/sim"
)

// scrape reads url's /metrics over HTTP and parses it.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// sample finds the series of family name whose labels include want; nil if none.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is a counter's or gauge's value, or a histogram's count; -1 when the series is missing.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	m := sample(fams, name, want)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 200 * time.Millisecond }})
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	a := env.Compute.API

	// A pool, a node of 8 GPUs in it, a reservation of 3 and a command to the node.
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "h100", MaxUses: 1})
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.Start(ctx, sim.Options{URL: url, Token: jt.Token, Gateway: gw, Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(wctx); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, "8 schedulable GPUs", func() bool {
		s, err := a.Capacity.Summary(ctx, env.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return err == nil && len(s.Models) == 1 && s.Models[0].Free == 8
	})
	if _, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 3}}); err != nil {
		t.Fatal(err)
	}
	cmd, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: f.Nodes[0].NodeID()}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, "the command's result", func() bool {
		c, err := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.FinishedAt != nil
	})

	// A failed call over HTTP, with a request id of the caller's: it is answered back. A
	// malformed one is replaced.
	ids := []struct{ sent, want string }{{"caller-id.1", "caller-id.1"}, {`spaces and "quotes"`, ""}, {strings.Repeat("x", 129), ""}}
	for _, tc := range ids {
		req, _ := http.NewRequest(http.MethodPost, url+"/api/compute/pools/create", strings.NewReader(`{"name":"h100"}`))
		req.Header.Set("Authorization", "Bearer "+env.RootKey)
		req.Header.Set("X-Request-Id", tc.sent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != http.StatusConflict || got == "" || tc.want != "" && got != tc.want || tc.want == "" && got == tc.sent {
			t.Fatalf("X-Request-Id %q: status %d, answered %q", tc.sent, resp.StatusCode, got)
		}
	}

	// Handshakes beyond the admission rate are refused (and counted).
	cfg, err := env.Compute.GatewayTLS(ctx, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for range 1000 {
		if _, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{}); err != nil {
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("no handshake refused")
	}

	var fams map[string]*dto.MetricFamily
	computetest.Eventually(t, 30*time.Second, "a flush and the workers' rounds", func() bool {
		fams = scrape(t, url)
		return value(fams, "better_compute_worker_last_success_timestamp_seconds", map[string]string{"worker": "gateway.flush"}) > 0 &&
			value(fams, "better_compute_worker_last_success_timestamp_seconds", map[string]string{"worker": "nodes"}) > 0 &&
			value(fams, "better_compute_gateway_last_flush_timestamp_seconds", nil) > 0
	})
	pool := map[string]string{"tenant": computetest.RootTenantID, "pool": "h100"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64 // at least, or exactly when exact
		exact  bool
	}{
		{"better_compute_api_calls_total", map[string]string{"method": "reservations.create", "code": "ok"}, 1, true},
		{"better_compute_api_call_seconds", map[string]string{"method": "reservations.create", "code": "ok"}, 1, true},
		{"better_compute_api_call_seconds", map[string]string{"method": "pools.create", "code": "conflict"}, float64(len(ids)), true},
		{"better_compute_api_call_seconds", map[string]string{"method": "commands.create", "code": "ok"}, 1, true},
		{"better_compute_batch_size", map[string]string{"method": "reservations.create"}, 1, false},
		{"better_compute_iam_decision_seconds", map[string]string{"outcome": "allowed"}, 4, false},
		{"better_compute_command_round_trip_seconds", map[string]string{"kind": api.CommandHealthCheck, "result": "succeeded"}, 1, true},
		{"better_compute_gateway_sessions", nil, 1, true},
		{"better_compute_gateway_heartbeat_interval_seconds", nil, 0.2, true},
		{"better_compute_gateway_admissions_refused_total", map[string]string{"stage": "handshake"}, float64(refused), true},
		{"better_compute_gateway_admissions_refused_total", map[string]string{"stage": "session"}, 0, true},
		{"better_compute_gateway_flush_seconds", nil, 1, false},
		{"better_compute_gateway_flush_nodes", nil, 1, false},
		{"better_compute_worker_tick_seconds", map[string]string{"worker": "reservation-lifecycle"}, 1, false},
		{"better_compute_gpus", pool, 8, true},
		{"better_compute_gpus_free", pool, 5, true},
		{"better_compute_gpus_used", pool, 3, true},
		{"better_compute_gpus_spot", pool, 0, true},
		{"better_compute_reservations", map[string]string{"pool": "h100", "state": api.ReservationActive}, 1, true},
		{"better_compute_db_conns_max", nil, 1, false},
		{"better_compute_db_conns", nil, 1, false},
		{"better_compute_db_conns_idle", nil, 0, false},
		{"better_compute_db_conns_acquired", nil, 0, false},
		{"better_compute_db_acquires_total", nil, 10, false},
		{"better_compute_db_acquire_waits_total", nil, 0, false},
		{"better_compute_db_acquire_wait_seconds_total", nil, 0, false},
	} {
		got := value(fams, c.name, c.labels)
		if c.exact && got != c.min || !c.exact && got < c.min {
			t.Errorf("%s%v = %v, want %v%v", c.name, c.labels, got, map[bool]string{true: "", false: ">= "}[c.exact], c.min)
		}
	}
	if _, ok := fams["better_compute_scrape_errors"]; ok {
		t.Errorf("a scrape query failed: %v", fams["better_compute_scrape_errors"])
	}
}

// TestMetricsPerCompute checks that two control planes in one process keep their own series.
func TestMetricsPerCompute(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	other := computetest.Attach(t, env, computetest.Options{})
	if _, err := env.Compute.API.Pools.Create(context.Background(), env.RootKey, api.CreatePool{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	created := map[string]string{"method": "pools.create", "code": "ok"}
	if n := value(scrape(t, env.Server(t)), "better_compute_api_calls_total", created); n != 1 {
		t.Fatalf("the first's pools.create calls = %v, want 1", n)
	}
	if n := value(scrape(t, other.Server(t)), "better_compute_api_calls_total", created); n != -1 {
		t.Fatalf("the second's pools.create calls = %v, want none", n)
	}
}
