package netpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/better-compute/compute/netpolicy"
)

// TestConnectionsAreCheckedAfterResolution: a name (localhost) that resolves to a refused address
// is refused at the connection, and the tenant's summary names the class, not the address.
func TestConnectionsAreCheckedAfterResolution(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	var strict *netpolicy.Policy
	// The creation's check lets a name through; the connection's refuses what it resolves to.
	_, err := strict.Client(0).Get("http://localhost:" + port + "/")
	var r *netpolicy.RefusedError
	if !errors.As(err, &r) || r.Class != "a loopback address" {
		t.Fatalf("a name resolving to loopback: %v, want refused at the connection", err)
	}
	if d := netpolicy.Describe(err); strings.Contains(d, "127.0.0.1") || !strings.Contains(d, "loopback") {
		t.Errorf("the tenant reads %q: it must name the class, not the address", d)
	}
	allowed, _ := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	resp, err := allowed.Client(0).Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("allowed: %v, %v", resp, err)
	}
	resp.Body.Close()
	if tr := strict.Transport(); tr.Proxy != nil {
		t.Error("the transport takes a proxy: the proxy would connect for it, unchecked")
	}
}

// TestRedirectsToRefusedAddressesAreNotFollowed: a redirect to an address the policy refuses is
// refused before its request is sent, whichever way it is spelled.
func TestRedirectsToRefusedAddressesAreNotFollowed(t *testing.T) {
	t.Parallel()
	hit := make(chan string, 10)
	target := &httptest.Server{Listener: listen(t, "127.0.0.2:0"), Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit <- r.URL.Path
	})}}
	target.Start()
	defer target.Close()
	_, port, _ := net.SplitHostPort(target.Listener.Addr().String())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	}))
	defer srv.Close()
	p, _ := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")})
	for _, to := range []string{"http://127.0.0.2:" + port + "/a", "http://0x7f000002:" + port + "/b", "http://127.2:" + port + "/c"} {
		_, err := p.Client(0).Get(srv.URL + "/?to=" + to)
		var r *netpolicy.RefusedError
		if !errors.As(err, &r) || !strings.Contains(err.Error(), "redirect") {
			t.Errorf("a redirect to %s: %v, want refused", to, err)
		}
	}
	select {
	case path := <-hit:
		t.Errorf("the refused address was reached (%s)", path)
	default:
	}
}

func listen(t *testing.T, addr string) net.Listener {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	return ln
}

// TestDescribeTellsNoAddress: the summary of a failed name lookup does not name the resolver.
func TestDescribeTellsNoAddress(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("post: %w", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x.invalid", Server: "10.0.0.53:53", IsNotFound: true}})
	if d := netpolicy.Describe(err); d != "the host name does not resolve" {
		t.Errorf("Describe = %q", d)
	}
	_, err = (&net.Dialer{}).DialContext(context.Background(), "tcp", "127.0.0.1:1")
	if d := netpolicy.Describe(err); d != "connection refused" {
		t.Errorf("Describe(%v) = %q", err, d)
	}
	o := netpolicy.Opaque("the API answered HTTP 500", errors.New("500: secret internal body"))
	wrapped := fmt.Errorf("create server: %w", o)
	if strings.Contains(wrapped.Error(), "secret") || !strings.Contains(netpolicy.Detail(wrapped), "secret internal body") {
		t.Errorf("Error %q, Detail %q: the body is the operator's alone", wrapped, netpolicy.Detail(wrapped))
	}
}
