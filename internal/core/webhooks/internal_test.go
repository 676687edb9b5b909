package webhooks

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/netpolicy"
)

// TestConnectionsToPrivateAddressesAreRefusedAtDial checks the check that names cannot dodge:
// the address a connection is about to use, after resolution. What the tenant reads names the
// address's class, never the address a name resolved to.
func TestConnectionsToPrivateAddressesAreRefusedAtDial(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	d := delivery{url: srv.URL, event: api.Event{ID: 1, Type: "test.x"}}
	status, why, _ := m.attempt(context.Background(), d, [][]byte{[]byte("k")})
	if status != 0 || !strings.Contains(why, "refused to connect") || !strings.Contains(why, "loopback") || strings.Contains(why, "127.0.0.1") {
		t.Errorf("an attempt to %s: status %d, %q; want refused before connecting, naming the class alone", srv.URL, status, why)
	}
	// "localhost" resolves to loopback: refused at creation by name, and at the connection too.
	d.url = strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	if _, why, _ := m.attempt(context.Background(), d, [][]byte{[]byte("k")}); !strings.Contains(why, "loopback") {
		t.Errorf("an attempt to %s: %q, want refused as loopback", d.url, why)
	}
	all, _ := netpolicy.New(netpolicy.AllRanges)
	allowed, _ := New(Config{Outbound: all})
	if status, why, _ := allowed.attempt(context.Background(), d, [][]byte{[]byte("k")}); status != http.StatusNoContent || why != "" {
		t.Errorf("with private targets allowed: %d %q", status, why)
	}
}

// TestFailedAttemptsTellTheTenantNoBodyNorResolver: an endpoint's failing answer is recorded
// by its status alone (its body may be an internal service's), and a name that does not
// resolve says so without the resolver's address.
func TestFailedAttemptsTellTheTenantNoBodyNorResolver(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "internal-secret: db password is hunter2", http.StatusInternalServerError)
	}))
	defer srv.Close()
	all, _ := netpolicy.New(netpolicy.AllRanges)
	m, err := New(Config{Outbound: all})
	if err != nil {
		t.Fatal(err)
	}
	if status, why, _ := m.attempt(context.Background(), delivery{url: srv.URL}, nil); status != 500 || why != "HTTP 500" {
		t.Errorf("a failing answer is recorded as %d %q, want HTTP 500 alone", status, why)
	}
	_, why, detail := m.attempt(context.Background(), delivery{url: "http://no-such-host.invalid/hook"}, nil)
	if why != "the host name does not resolve" || detail == nil {
		t.Errorf("an unresolvable name is recorded as %q (detail %v)", why, detail)
	}
}

// TestAttemptsAreBoundedInTimeAndSize times out a receiver that does not answer and reads a
// huge answer only up to the bound, and follows no redirect.
func TestAttemptsAreBoundedInTimeAndSize(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			select {
			case <-block:
			case <-r.Context().Done():
			}
		case "/huge":
			w.WriteHeader(http.StatusOK)
			chunk := []byte(strings.Repeat("x", 1<<16))
			for i := 0; i < 1<<12; i++ { // 256 MiB, were it all read
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		}
	}))
	defer srv.Close()
	defer close(block) // before Close, which waits for the handlers
	all, _ := netpolicy.New(netpolicy.AllRanges)
	m, err := New(Config{Outbound: all, Timeout: 300 * time.Millisecond, MaxResponseBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	_, why, _ := m.attempt(context.Background(), delivery{url: srv.URL + "/slow"}, nil)
	if took := time.Since(at); why != "timed out" || took > 4*time.Second {
		t.Errorf("a receiver that never answers: %q after %s, want a timeout after 300ms", why, took)
	}
	at = time.Now()
	if status, why, _ := m.attempt(context.Background(), delivery{url: srv.URL + "/huge"}, nil); status != 200 || why != "" || time.Since(at) > 2*time.Second {
		t.Errorf("a huge answer: %d %q after %s, want delivered without reading it all", status, why, time.Since(at))
	}
	if status, why, _ := m.attempt(context.Background(), delivery{url: srv.URL + "/moved"}, nil); status != http.StatusFound || !strings.HasPrefix(why, "HTTP 302") {
		t.Errorf("a redirect: %d %q, want a failed attempt with the 302, not followed", status, why)
	}
}

// TestBackoffDoublesWithinItsJitterUpToTheBound is a property of every job and attempt.
func TestBackoffDoublesWithinItsJitterUpToTheBound(t *testing.T) {
	t.Parallel()
	m, err := New(Config{RetryBase: time.Second, RetryMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(t *rapid.T) {
		job := rapid.Int64().Draw(t, "job")
		attempt := rapid.IntRange(1, 20_000).Draw(t, "attempt")
		d := m.backoff(job, attempt)
		ideal := time.Hour
		if attempt <= 12 {
			ideal = min(time.Second<<(attempt-1), time.Hour)
		}
		if d < ideal*8/10 || d >= ideal*12/10 {
			t.Fatalf("attempt %d of job %d waits %s, want within ±20%% of %s", attempt, job, d, ideal)
		}
		if again := m.backoff(job, attempt); again != d {
			t.Fatalf("the same job and attempt wait %s, then %s: Work and NextRetry would disagree", d, again)
		}
	})
}
