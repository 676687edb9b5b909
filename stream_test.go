package compute_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
)

// streamEnv is a control plane serving the API over HTTP, with its sequencer running.
func streamEnv(t *testing.T) (*computetest.Env, string) {
	t.Helper()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	if err := env.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return env, url
}

func emit(t *testing.T, env *computetest.Env, tenant string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := events.Emit(context.Background(), env.DB.Pool, "node.online", tenant, fmt.Sprintf("s%03d", i), map[string]any{"i": i}); err != nil {
			t.Error(err) // not Fatal: emit also runs on a goroutine of its own
			return
		}
	}
}

// cutting drops each connection's body after limit bytes, as a network that fails mid-burst.
type cutting struct {
	limit int
	cuts  atomic.Int32
}

func (c *cutting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, api.EventStreamPath) {
		return resp, err
	}
	resp.Body = &cutBody{ReadCloser: resp.Body, left: c.limit, c: c}
	return resp, nil
}

type cutBody struct {
	io.ReadCloser
	left int
	c    *cutting
}

func (b *cutBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.c.cuts.Add(1)
		return 0, errors.New("connection reset (cut by the test)")
	}
	n, err := b.ReadCloser.Read(p[:min(len(p), b.left)])
	b.left -= n
	return n, err
}

// TestEventStreamResumesWithoutGapOrDuplicate: a watcher whose connection drops every few
// hundred bytes, in the middle of events, while events keep being written, gets every event of
// its tenant once, in order, and none of another tenant's.
func TestEventStreamResumesWithoutGapOrDuplicate(t *testing.T) {
	t.Parallel()
	env, url := streamEnv(t)
	other, _ := env.Tenant(t, "other")
	emit(t, env, computetest.RootTenantID, 0, 40)
	emit(t, env, other, 0, 10)
	cut := &cutting{limit: 700}
	c, err := client.New(url, client.WithAPIKey(env.RootKey), client.WithHTTPClient(&http.Client{Transport: cut}))
	if err != nil {
		t.Fatal(err)
	}
	reading := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		<-reading
		emit(t, env, computetest.RootTenantID, 40, 80) // while the watcher reads
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []api.Event
	stop := errors.New("enough")
	err = c.WatchEvents(ctx, client.WatchOptions{}, func(e api.Event) error {
		got = append(got, e)
		if len(got) == 20 {
			close(reading)
		}
		if len(got) == 80 {
			return stop
		}
		return nil
	})
	<-wrote
	if !errors.Is(err, stop) {
		t.Fatalf("watch ended with %v after %d events", err, len(got))
	}
	if cut.cuts.Load() < 3 {
		t.Fatalf("the connection was cut %d times; the test means to cut it mid-burst several times", cut.cuts.Load())
	}
	for i, e := range got {
		if want := fmt.Sprintf("s%03d", i); e.Subject != want || e.TenantID != computetest.RootTenantID {
			t.Fatalf("event %d is %s of %s, want %s of root (a gap, a duplicate or another tenant's)", i, e.Subject, e.TenantID, want)
		}
		if i > 0 && e.ID <= got[i-1].ID {
			t.Fatalf("event ids out of order: %d after %d", e.ID, got[i-1].ID)
		}
	}
}

// TestEventStreamAnswersLikeTheAPI: the stream starts after Last-Event-ID; a bad one, no key, and
// a method other than GET are refused with the API's errors, before any stream begins.
func TestEventStreamAnswersLikeTheAPI(t *testing.T) {
	t.Parallel()
	env, url := streamEnv(t)
	emit(t, env, computetest.RootTenantID, 0, 5)
	get := func(method, key, lastID string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url+api.BasePath+api.EventStreamPath, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	computetest.Eventually(t, 10*time.Second, "the sequencer to place the five events", func() bool {
		p, err := env.Compute.API.Events.List(context.Background(), env.RootKey, api.ListEvents{})
		return err == nil && len(p.Items) == 5
	})
	resp := get(http.MethodGet, env.RootKey, "3")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	var ids []string
	for sc.Scan() && len(ids) < 2 {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			ids = append(ids, id)
		}
	}
	if strings.Join(ids, ",") != "4,5" {
		t.Fatalf("after Last-Event-ID 3 the stream sent ids %v, want 4,5", ids)
	}
	for _, c := range []struct {
		method, key, lastID string
		status              int
		says                string
	}{
		{http.MethodGet, env.RootKey, "three", http.StatusBadRequest, "Last-Event-ID"},
		{http.MethodGet, env.RootKey, "-1", http.StatusBadRequest, "Last-Event-ID"},
		{http.MethodGet, "", "", http.StatusUnauthorized, ""},
		{http.MethodPost, env.RootKey, "", http.StatusMethodNotAllowed, "GET"},
	} {
		resp := get(c.method, c.key, c.lastID)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != c.status || !strings.Contains(string(body), c.says) {
			t.Errorf("%s with key %t, Last-Event-ID %q: %s %s, want %d naming %q", c.method, c.key != "", c.lastID, resp.Status, body, c.status, c.says)
		}
	}
}

// TestEventStreamsPerKeyAreCapped: a key holds at most MaxEventStreamsPerKey streams at once in
// a process; one more is refused as quota_exceeded (429) naming the limit, another key is not
// affected, and a stream that ends gives its place back.
func TestEventStreamsPerKeyAreCapped(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.MaxEventStreamsPerKey = 2 }})
	url := env.Server(t)
	_, otherKey := env.Tenant(t, "other")
	open := func(key string) (*http.Response, context.CancelFunc) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+api.BasePath+api.EventStreamPath, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		return resp, cancel
	}
	first, cancelFirst := open(env.RootKey)
	second, _ := open(env.RootKey)
	for _, r := range []*http.Response{first, second} {
		if r.StatusCode != http.StatusOK {
			t.Fatalf("a stream within the limit: %d", r.StatusCode)
		}
	}
	third, _ := open(env.RootKey)
	var body api.ErrorBody
	if err := json.NewDecoder(third.Body).Decode(&body); err != nil || third.StatusCode != http.StatusTooManyRequests ||
		body.Error == nil || body.Error.Code != api.CodeQuotaExceeded || body.Error.Details["reason"] != "event_streams" || body.Error.Details["limit"] != float64(2) {
		t.Fatalf("a third stream of one key: %d %+v (%v), want 429 quota_exceeded with reason event_streams and limit 2", third.StatusCode, body.Error, err)
	}
	if r, _ := open(otherKey); r.StatusCode != http.StatusOK {
		t.Fatalf("another key's stream: %d", r.StatusCode)
	}
	cancelFirst()
	computetest.Eventually(t, 30*time.Second, "the ended stream's place given back", func() bool {
		r, cancel := open(env.RootKey)
		defer cancel()
		return r.StatusCode == http.StatusOK
	})
}
