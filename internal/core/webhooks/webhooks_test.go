package webhooks_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// verify checks a request the Standard Webhooks way, written from the specification
// (https://www.standardwebhooks.com), not from the sender's code: the signed content is
// id.timestamp.body, the key is the base64 after whsec_, and any one of the space-separated
// v1 signatures may match. The timestamp must be within five minutes.
func verify(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("a webhook- header is missing")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > 5*time.Minute {
		return fmt.Errorf("timestamp %q is not within five minutes", ts)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(body)))
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(s, ",")
		got, err := base64.StdEncoding.DecodeString(sig)
		if ok && version == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no signature matches")
}

// receiver is a webhook endpoint on loopback that records what it accepts and answers as
// told: up, 503, or not listening at all.
type receiver struct {
	t       *testing.T
	addr    string
	secrets []string // any of them must verify every request

	mu       sync.Mutex
	srv      *http.Server
	status   int
	got      []api.Event
	seen     map[string]bool
	requests int
	badSigs  []string
	sigCount []int
	changed  chan struct{} // closed, and replaced, at each request
}

func newReceiver(t *testing.T) *receiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{t: t, addr: ln.Addr().String(), status: http.StatusOK, seen: map[string]bool{}, changed: make(chan struct{})}
	r.serve(ln)
	t.Cleanup(r.down)
	return r
}

func (r *receiver) url() string { return "http://" + r.addr + "/hook" }

func (r *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// down stops listening: connections are refused.
func (r *receiver) down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// up listens again on the same address.
func (r *receiver) up() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("listen again on %s: %v", r.addr, err)
	}
	r.serve(ln)
}

func (r *receiver) answer(status int) {
	r.mu.Lock()
	r.status = status
	r.mu.Unlock()
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	defer func() { close(r.changed); r.changed = make(chan struct{}) }()
	for _, s := range r.secrets {
		if err := verify(s, req.Header, body); err != nil {
			r.badSigs = append(r.badSigs, err.Error())
		}
	}
	r.sigCount = append(r.sigCount, len(strings.Fields(req.Header.Get("webhook-signature"))))
	if r.status != http.StatusOK {
		http.Error(w, "not now", r.status)
		return
	}
	var e api.Event
	if err := json.Unmarshal(body, &e); err != nil {
		r.t.Errorf("a delivery is not an event: %v", err)
	}
	if id := req.Header.Get("webhook-id"); id != "evt_"+strconv.FormatInt(e.ID, 10) {
		r.t.Errorf("webhook-id %q for event %d", id, e.ID)
	}
	if !r.seen[req.Header.Get("webhook-id")] {
		r.seen[req.Header.Get("webhook-id")] = true
		r.got = append(r.got, e)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) events() []api.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]api.Event(nil), r.got...)
}

// waitFor waits until the receiver has accepted n distinct events, and returns them.
func (r *receiver) waitFor(n int, within time.Duration) []api.Event {
	r.t.Helper()
	return r.until(fmt.Sprintf("%d distinct events", n), within, func() bool { return len(r.got) >= n })
}

// until waits for the receiver's requests to make ok (called under its lock) hold, and returns
// the events it has accepted.
func (r *receiver) until(what string, within time.Duration, ok func() bool) []api.Event {
	r.t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		r.mu.Lock()
		done, changed := ok(), r.changed
		r.mu.Unlock()
		if done {
			return r.events()
		}
		select {
		case <-changed:
		case <-timeout.C:
			got := r.events()
			r.t.Errorf("the receiver has %d distinct events after %s, without %s", len(got), within, what)
			return got
		}
	}
}

// fastRetries is a control plane whose webhooks retry within a second and may reach loopback.
func fastRetries(o *compute.Options) {
	o.Webhooks = compute.WebhookOptions{AllowPrivateTargets: true, RetryBase: 50 * time.Millisecond, RetryMax: 400 * time.Millisecond, Timeout: 2 * time.Second}
}

type env struct {
	*computetest.Env
	tenant string
	cl     *client.Client
	url    string
}

func start(t *testing.T, configure func(*compute.Options)) env {
	t.Helper()
	e := computetest.New(t, computetest.Options{Configure: configure})
	tenant, key := e.Tenant(t, "acme")
	url := e.Server(t)
	cl, err := client.New(url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return env{e, tenant, cl, url}
}

// emit writes events of the tenant as a module would, in one transaction each.
func (e env) emit(t *testing.T, typ string, subjects ...string) {
	t.Helper()
	for _, s := range subjects {
		if err := events.Emit(context.Background(), e.DB.Pool, typ, e.tenant, s, map[string]any{"at": time.Now().UnixNano()}); err != nil {
			t.Fatal(err)
		}
	}
}

// dump logs the deliveries and their jobs that are not done, to see why a test failed.
func (e env) dump(t *testing.T) {
	t.Helper()
	computetest.LogRows(t, e.DB.Pool, "not done", `SELECT format('delivery %s event %s subject %s %s attempts %s next %s gen %s', id, event_seq, subject, state, attempts, next_attempt_at, generation)
		FROM compute.webhook_deliveries WHERE state <> 'delivered'
		UNION ALL SELECT format('job %s %s attempt %s at %s args %s meta %s errors %s', id, state, attempt, scheduled_at, args, metadata, errors)
		FROM compute.river_job WHERE state <> 'completed'`)
}

// TestEveryEventArrivesSignedAndInOrderAcrossAnOutage is the check: a receiver that
// refuses connections, then answers 503, then is up, gets every event, each subject's in log
// order, every request signed by a secret the receiver verifies itself.
func TestEveryEventArrivesSignedAndInOrderAcrossAnOutage(t *testing.T) {
	// Not parallel: its receiver listens again on the port it freed, which a test beside it could take.
	ctx := context.Background()
	e := start(t, fastRetries)
	r := newReceiver(t)
	w, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: r.url(), EventTypes: []string{"test."}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(w.Secret, "whsec_") {
		t.Fatalf("webhooks.create answered secret %q", w.Secret)
	}
	r.mu.Lock()
	r.secrets = []string{w.Secret}
	r.mu.Unlock()
	list, err := e.cl.Webhooks.List(ctx, api.ListWebhooks{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Secret != "" {
		t.Fatalf("webhooks.list = %+v, %v: want the endpoint, without its secret", list.Items, err)
	}

	r.down()
	subjects := []string{"a", "b", "c"}
	for range 8 {
		e.emit(t, "test.tick", subjects...)
	}
	e.emit(t, "other.tick", "a") // filtered out
	// Each phase lasts until an attempt was made in it: on a loaded machine a fixed pause (retries
	// wait for River's fetch poll, a second) may pass with none.
	computetest.Eventually(t, 30*time.Second, "an attempt refused", func() bool {
		return computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.webhook_attempts WHERE error LIKE '%connection refused%'`) > 0
	})
	r.answer(http.StatusServiceUnavailable)
	r.up()
	r.until("an attempt answered 503", 30*time.Second, func() bool { return r.requests > 0 })
	if t.Failed() {
		t.FailNow()
	}
	r.answer(http.StatusOK)
	for range 4 {
		e.emit(t, "test.tick", subjects...)
	}

	defer func() {
		if t.Failed() {
			e.dump(t)
		}
	}()
	// The filtered event must not come: events are fanned out in log order, so the deliveries of
	// the events after it (36, checked below) show it was passed over.
	got := r.waitFor(36, 30*time.Second)
	// The sender records a delivery, and then counts it, after the receiver has answered: the
	// counter of the last one is what says every delivery is recorded.
	scrape := func() map[string]*dto.MetricFamily {
		resp, err := http.Get(e.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fam, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fam
	}
	outcomes := func() map[string]float64 {
		o := map[string]float64{}
		for _, m := range scrape()["better_compute_webhook_attempts_total"].GetMetric() {
			o[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
		return o
	}
	computetest.Eventually(t, 30*time.Second, "36 deliveries recorded and counted", func() bool { return outcomes()["delivered"] >= 36 })
	if len(got) != 36 {
		t.Errorf("the receiver has %d distinct events, want 36 (the filtered one must not come)", len(got))
	}
	last := map[string]int64{}
	for _, ev := range got {
		if ev.Type != "test.tick" || ev.TenantID != e.tenant {
			t.Errorf("delivered %s of tenant %s", ev.Type, ev.TenantID)
		}
		if ev.ID <= last[ev.Subject] {
			t.Errorf("subject %s: event %d arrived after event %d", ev.Subject, ev.ID, last[ev.Subject])
		}
		last[ev.Subject] = ev.ID
	}
	r.mu.Lock()
	bad := r.badSigs
	r.mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("%d requests failed the receiver's own verification, e.g. %s", len(bad), bad[0])
	}

	page, err := e.cl.Webhooks.Deliveries(ctx, api.ListWebhookDeliveries{Webhook: w.ID, PageRequest: api.PageRequest{Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	var refused, unavailable, retried int
	for _, d := range page.Items {
		if d.State != api.DeliveryDelivered || d.DeliveredAt == nil {
			t.Errorf("delivery %d of event %d is %s", d.ID, d.EventID, d.State)
		}
		if d.Attempts > 1 {
			retried++
		}
		for _, a := range d.LastAttempts {
			switch {
			case strings.Contains(a.Error, "connection refused"):
				refused++
			case a.Status == http.StatusServiceUnavailable && strings.HasPrefix(a.Error, "HTTP 503"):
				unavailable++
			}
		}
	}
	if len(page.Items) != 36 || retried == 0 || refused == 0 || unavailable == 0 {
		t.Errorf("%d deliveries, %d retried, attempts: %d refused, %d answered 503; want 36 and some of each",
			len(page.Items), retried, refused, unavailable)
	}

	// Each failed attempt is counted after it is recorded, as the delivered ones are.
	var counted map[string]float64
	computetest.Eventually(t, 30*time.Second, fmt.Sprintf("the %d failed attempts recorded counted", refused+unavailable), func() bool {
		counted = outcomes()
		return counted["failed"] >= float64(refused+unavailable)
	})
	if counted["delivered"] < 36 || counted["failed"] < float64(refused+unavailable) {
		t.Errorf("webhook attempt counters %v, want ≥ 36 delivered and ≥ %d failed", counted, refused+unavailable)
	}
	if n := scrape()["better_compute_webhook_attempt_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n < 36 {
		t.Errorf("attempt durations observed %d times, want ≥ 36", n)
	}
}

// TestRotatedSecretsSignTogetherUntilThePreviousExpires checks rotation: both secrets sign while
// the old one is kept, the new alone once it is dropped.
func TestRotatedSecretsSignTogetherUntilThePreviousExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := start(t, fastRetries)
	r := newReceiver(t)
	w, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: r.url()})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := e.cl.Webhooks.RotateSecret(ctx, api.RotateWebhookSecret{Webhook: w.ID, KeepPrevious: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Secret == "" || rotated.Secret == w.Secret || rotated.PreviousSecretUntil == nil {
		t.Fatalf("rotateSecret answered %+v", rotated)
	}
	r.mu.Lock()
	r.secrets = []string{w.Secret, rotated.Secret} // each must verify on its own
	r.mu.Unlock()
	e.emit(t, "test.one", "x")
	r.waitFor(1, 10*time.Second)

	dropped, err := e.cl.Webhooks.RotateSecret(ctx, api.RotateWebhookSecret{Webhook: w.ID, KeepPrevious: "0s"})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.secrets = []string{dropped.Secret}
	r.mu.Unlock()
	e.emit(t, "test.two", "x")
	r.waitFor(2, 10*time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.badSigs) > 0 {
		t.Errorf("signatures failed: %v", r.badSigs)
	}
	if len(r.sigCount) != 2 || r.sigCount[0] != 2 || r.sigCount[1] != 1 {
		t.Errorf("signatures per request %v, want [2 1]", r.sigCount)
	}
}

// TestDeadDeliveriesAreRedeliveredOnDemand gives a delivery up after the dead-letter age, with
// its event, and sends it again when asked.
func TestDeadDeliveriesAreRedeliveredOnDemand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := start(t, func(o *compute.Options) {
		fastRetries(o)
		// Long enough for a retry or two even when River's fetch poll (a second) and a loaded
		// machine delay each one: the test wants a delivery that was tried again and then died.
		o.Webhooks.DeadAfter = 8 * time.Second
	})
	r := newReceiver(t)
	r.answer(http.StatusInternalServerError)
	w, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: r.url()})
	if err != nil {
		t.Fatal(err)
	}
	e.emit(t, "test.doomed", "x")
	var dead api.WebhookDelivery
	computetest.Eventually(t, 30*time.Second, "a dead delivery", func() bool {
		page, err := e.cl.Webhooks.Deliveries(ctx, api.ListWebhookDeliveries{Webhook: w.ID, State: api.DeliveryDead})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) == 1 {
			dead = page.Items[0]
		}
		return dead.ID != 0
	})
	if dead.Attempts < 2 {
		t.Fatalf("a dead delivery without several attempts: %+v", dead)
	}
	var evs api.Page[api.Event]
	computetest.Eventually(t, 30*time.Second, "a webhook.dead event", func() bool {
		if evs, err = e.cl.Events.List(ctx, api.ListEvents{Type: "webhook.dead"}); err != nil {
			t.Fatal(err)
		}
		return len(evs.Items) > 0
	})
	if len(evs.Items) != 1 || evs.Items[0].Subject != w.ID {
		t.Fatalf("webhook.dead events: %+v, %v", evs.Items, err)
	}
	if n := len(r.events()); n != 0 {
		t.Fatalf("the receiver accepted %d events while answering 500", n)
	}

	r.answer(http.StatusOK)
	again, err := e.cl.Webhooks.Redeliver(ctx, api.RedeliverWebhook{Delivery: dead.ID})
	if err != nil || again.State != api.DeliveryPending {
		t.Fatalf("redeliver: %+v, %v", again, err)
	}
	got := r.waitFor(1, 10*time.Second)
	if got[0].ID != dead.EventID || got[0].Type != "test.doomed" {
		t.Errorf("redelivered %+v, want event %d", got[0], dead.EventID)
	}
	if _, err := e.cl.Webhooks.Redeliver(ctx, api.RedeliverWebhook{Delivery: dead.ID + 1000}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("redeliver of no delivery: %v, want not_found", err)
	}
}

// TestTestEventsGoToTheirEndpointAlone sends webhooks.test to one of two endpoints.
func TestTestEventsGoToTheirEndpointAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := start(t, fastRetries)
	r1, r2 := newReceiver(t), newReceiver(t)
	w1, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: r1.url(), EventTypes: []string{"node.offline"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: r2.url()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.Webhooks.Test(ctx, api.WebhookRef{Webhook: w1.ID}); err != nil {
		t.Fatal(err)
	}
	got := r1.waitFor(1, 10*time.Second)
	if got[0].Type != "webhook.test" || got[0].Subject != w1.ID {
		t.Errorf("endpoint 1 got %+v", got[0])
	}
	e.emit(t, "test.after", "x") // endpoint 2 takes every type: this proves it saw nothing before
	if got := r2.waitFor(1, 10*time.Second); got[0].Type != "test.after" {
		t.Errorf("endpoint 2 got %+v first, want test.after (the test event is endpoint 1's alone)", got[0])
	}
	if _, err := e.cl.Webhooks.Delete(ctx, api.WebhookRef{Webhook: w1.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.Webhooks.Test(ctx, api.WebhookRef{Webhook: w1.ID}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("test of a deleted webhook: %v, want not_found", err)
	}
}

// TestPrivateTargetsAreRefusedUnlessAllowed creates endpoints on a control plane with the
// default options.
func TestPrivateTargetsAreRefusedUnlessAllowed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := start(t, func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} })
	for _, u := range []string{"http://127.0.0.1:9/x", "https://localhost/x", "http://[::1]/x", "http://10.1.2.3/x", "http://169.254.169.254/latest/meta-data", "http://[::ffff:127.0.0.1]/x", "http://100.64.0.1/"} {
		_, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: u})
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "url") {
			t.Errorf("create %s: %v, want invalid_argument naming url", u, err)
		}
	}
	for _, u := range []string{"ftp://example.com/", "https://user:pw@example.com/", "https:///nohost", "https://example.com/#frag", ""} {
		if _, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: u}); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Errorf("create %q: %v, want invalid_argument", u, err)
		}
	}
	if _, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: "https://hooks.example.com/x", EventTypes: []string{"Node.Offline"}}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("a bad event type filter: %v, want invalid_argument", err)
	}
	if _, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: "https://hooks.example.com/x"}); err != nil {
		t.Errorf("a public endpoint: %v", err)
	}
}

// refusedSpellings are hosts a resolver reads as addresses no endpoint may have, spelled as the
// issue found them accepted (issue 29, items 4 and 6): each must be refused by webhooks.create.
var refusedSpellings = []string{"127.1", "0x7f000001", "2130706433", "017700000001", "0", "127.000.000.001", "0177.0.0.1", "127.0.0.1.",
	"192.0.2.1", "198.51.100.7", "203.0.113.9", "0xa9fea9fe", "[0000:0000::0002]", "[::127.0.0.1]", "[64:ff9b::7f00:1]", "[2002:7f00:1::]",
	"[fec0::1]", "[::ffff:7f00:1]", "[2001:db8::1]", "LOCALHOST.", "a.localhost"}

// TestNumericSpellingsOfRefusedAddressesAreRefused is the regression test of webhooks.create
// accepting 127.1 and its kin: every spelling is refused naming url, on a control plane with the
// default outbound policy.
func TestNumericSpellingsOfRefusedAddressesAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := start(t, func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} })
	for _, h := range refusedSpellings {
		u := "http://" + h + ":8080/hook"
		_, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: u})
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "url" {
			t.Errorf("create %s: %v, want invalid_argument naming url", u, err)
		}
	}
}

// TestEndpointsPerTenantAreCapped (issue 29, item 8): a tenant holds at most
// Options.Webhooks.MaxEndpointsPerTenant endpoints, however many creations race; one more is
// quota_exceeded, and another tenant's endpoints are its own count.
func TestEndpointsPerTenantAreCapped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 3
	e := start(t, func(o *compute.Options) { o.Webhooks.MaxEndpointsPerTenant = limit })
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.cl.Webhooks.Create(ctx, api.CreateWebhook{URL: fmt.Sprintf("https://hooks.example.com/%d", i)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	made := 0
	for err := range errs {
		var ae *api.Error
		switch {
		case err == nil:
			made++
		case errors.As(err, &ae) && ae.Code == api.CodeQuotaExceeded && ae.Details["reason"] == "too_many_endpoints":
		default:
			t.Errorf("a creation past the limit: %v, want quota_exceeded", err)
		}
	}
	page, err := e.cl.Webhooks.List(ctx, api.ListWebhooks{})
	if err != nil || made != limit || len(page.Items) != limit {
		t.Fatalf("%d creations succeeded, %d endpoints listed (%v); want %d", made, len(page.Items), err, limit)
	}
	_, key := e.Tenant(t, "other")
	other, err := client.New(e.url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Webhooks.Create(ctx, api.CreateWebhook{URL: "https://hooks.example.com/other"}); err != nil {
		t.Errorf("another tenant's first endpoint: %v", err)
	}
}
