package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"
)

// Control is a net.Dialer's Control hook: it refuses a connection whose address the policy
// refuses. It runs after resolution, on the address about to be connected to, so a name that
// resolves to a refused address is refused whatever it resolved to before (DNS rebinding), and
// a redirect to one is refused too.
func (p *Policy) Control(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("netpolicy: %q is not host:port: %w", address, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("netpolicy: %q is not an address: %w", host, err)
	}
	return p.CheckAddr(ip)
}

// DefaultDialTimeout bounds a connection's set-up.
const DefaultDialTimeout = 10 * time.Second

// Dialer returns a dialer whose connections the policy checks (Control), each bounded by
// timeout (DefaultDialTimeout when 0).
func (p *Policy) Dialer(timeout time.Duration) *net.Dialer {
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	return &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: p.Control}
}

// DialContext dials address through Dialer: for a driver that takes a dial function (IPMI's
// UDP, say).
func (p *Policy) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return p.Dialer(0).DialContext(ctx, network, address)
}

// Transport returns an HTTP transport that connects only where the policy allows, and never
// through a proxy from the environment (the proxy would connect for it, unchecked). Callers
// may set its TLSClientConfig.
func (p *Policy) Transport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           p.Dialer(0).DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
}

// MaxRedirects is how many redirects Client follows.
const MaxRedirects = 5

// Client returns an HTTP client over Transport, bounded by timeout (none when 0), that follows
// at most MaxRedirects redirects and none to a host the policy refuses (a redirect's address is
// also checked when it is connected to).
func (p *Policy) Client(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: p.Transport(), CheckRedirect: p.CheckRedirect}
}

// CheckRedirect is an http.Client's CheckRedirect under the policy.
func (p *Policy) CheckRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= MaxRedirects {
		return fmt.Errorf("netpolicy: stopped after %d redirects", len(via))
	}
	if err := p.CheckHost(req.URL.Hostname()); err != nil {
		var r *RefusedError
		if errors.As(err, &r) {
			r.Host = "" // the answer chose it: it is not the tenant's to read back
			return fmt.Errorf("refused to follow a redirect: %w", r)
		}
		return fmt.Errorf("refused to follow a redirect: %w", err)
	}
	return nil
}
