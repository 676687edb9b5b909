package webhooks

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
)

// TestConnectionsToPrivateAddressesAreRefusedAtDial checks the check that names cannot dodge:
// the address a connection is about to use, after resolution.
func TestConnectionsToPrivateAddressesAreRefusedAtDial(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	d := delivery{url: srv.URL, event: api.Event{ID: 1, Type: "test.x"}}
	status, why := m.attempt(context.Background(), d, [][]byte{[]byte("k")})
	if status != 0 || !strings.Contains(why, "refused to connect to 127.0.0.1: is a loopback address") {
		t.Errorf("an attempt to %s: status %d, %q; want refused before connecting", srv.URL, status, why)
	}
	// "localhost" resolves to loopback: refused at creation by name, and at the connection too.
	d.url = strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	if _, why := m.attempt(context.Background(), d, [][]byte{[]byte("k")}); !strings.Contains(why, "loopback") {
		t.Errorf("an attempt to %s: %q, want refused as loopback", d.url, why)
	}
	allowed, _ := New(Config{AllowPrivateTargets: true})
	if status, why := allowed.attempt(context.Background(), d, [][]byte{[]byte("k")}); status != http.StatusNoContent || why != "" {
		t.Errorf("with private targets allowed: %d %q", status, why)
	}
}

// TestAttemptsAreBoundedInTimeAndSize times out a receiver that does not answer and reads a
// huge answer only up to the bound, and follows no redirect.
func TestAttemptsAreBoundedInTimeAndSize(t *testing.T) {
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
	m, err := New(Config{AllowPrivateTargets: true, Timeout: 300 * time.Millisecond, MaxResponseBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	_, why := m.attempt(context.Background(), delivery{url: srv.URL + "/slow"}, nil)
	if took := time.Since(at); !strings.Contains(why, "Timeout") || took > 4*time.Second {
		t.Errorf("a receiver that never answers: %q after %s, want a timeout after 300ms", why, took)
	}
	at = time.Now()
	if status, why := m.attempt(context.Background(), delivery{url: srv.URL + "/huge"}, nil); status != 200 || why != "" || time.Since(at) > 2*time.Second {
		t.Errorf("a huge answer: %d %q after %s, want delivered without reading it all", status, why, time.Since(at))
	}
	if status, why := m.attempt(context.Background(), delivery{url: srv.URL + "/moved"}, nil); status != http.StatusFound || !strings.HasPrefix(why, "HTTP 302") {
		t.Errorf("a redirect: %d %q, want a failed attempt with the 302, not followed", status, why)
	}
}

// TestBackoffDoublesWithinItsJitterUpToTheBound is a property of every job and attempt.
func TestBackoffDoublesWithinItsJitterUpToTheBound(t *testing.T) {
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

// TestRefusedAddressesAreExactlyTheNonPublicOnes checks the classification on both sides.
func TestRefusedAddressesAreExactlyTheNonPublicOnes(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "::1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "fe80::1", "fc00::1",
		"0.0.0.0", "::", "224.0.0.1", "100.64.1.1", "::ffff:10.0.0.1", "255.255.255.255", "198.18.0.1"} {
		if refusedAddr(netip.MustParseAddr(a)) == "" {
			t.Errorf("%s is accepted as a public address", a)
		}
	}
	for _, a := range []string{"1.1.1.1", "8.8.8.8", "2606:4700:4700::1111", "172.32.0.1", "100.128.0.1", "::ffff:1.1.1.1"} {
		if why := refusedAddr(netip.MustParseAddr(a)); why != "" {
			t.Errorf("%s is refused: %s", a, why)
		}
	}
}
