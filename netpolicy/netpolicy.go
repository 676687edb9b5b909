// Package netpolicy is the outbound policy of Better Compute: which addresses the control plane
// may connect to where a tenant chose where (a webhook's URL, a provider account's endpoint, the
// BMC of a machine with no site, an image's URL). A tenant must not make the control plane reach
// what only the control plane can reach: its own loopback, the cloud's metadata service on a
// link-local address, the private networks of the data centre.
//
// The policy is applied twice: when a tenant sets an address (CheckHost, CheckURL: a host
// written as an address in any spelling a resolver accepts is judged as that address, so 127.1,
// 0x7f000001 and 2130706433 are all loopback), and at every connection (Control, on the
// address a name resolved to, after resolution), so that neither a name nor a redirect dodges
// it. Ranges that are not public are refused unless the operator allows them (New). The
// package imports only the standard library; modules get the control plane's policy as
// modules.Runtime.Outbound. docs/security.md describes it.
package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// Policy decides which addresses outbound connections may reach. The nil *Policy is the
// default policy: public addresses only.
type Policy struct {
	allow []netip.Prefix
}

// New returns the policy that refuses every range of the package's classes (docs/security.md)
// except those allow lists: each is allowed as written, whatever class it falls in.
func New(allow []netip.Prefix) (*Policy, error) {
	p := &Policy{}
	for i, a := range allow {
		if !a.IsValid() {
			return nil, fmt.Errorf("netpolicy: allowed range [%d] is not a range (CIDR, e.g. 10.0.0.0/8)", i)
		}
		if a != a.Masked() {
			return nil, fmt.Errorf("netpolicy: allowed range [%d] %s has host bits set: write %s", i, a, a.Masked())
		}
		p.allow = append(p.allow, a)
	}
	return p, nil
}

// Allowed returns the ranges the policy allows beyond the public ones.
func (p *Policy) Allowed() []netip.Prefix {
	if p == nil {
		return nil
	}
	return slices.Clone(p.allow)
}

// AllRanges is every address, IPv4 and IPv6: allowing them turns the policy off, as
// compute.Options.Webhooks.AllowPrivateTargets does (tests, a host whose receivers are all its own).
var AllRanges = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// RefusedError is the policy's refusal of an address.
type RefusedError struct {
	// Host is the host as the tenant wrote it; empty for a connection's address, which came
	// from a resolver the tenant must not learn about.
	Host  string
	Addr  netip.Addr   // the address refused
	Class string       // e.g. "a loopback address"
	Range netip.Prefix // the class's range that holds Addr
}

func (e *RefusedError) Error() string {
	what := fmt.Sprintf("%s (%s)", e.Class, e.Range)
	switch {
	case e.Host == "":
		return "refused to connect: the host's address is " + what + ", which the outbound policy refuses"
	case e.Host == e.Addr.String():
		return e.Host + " is " + what
	}
	return fmt.Sprintf("%q is %s, %s", e.Host, e.Addr, what)
}

// ErrNotHost is the error of a host that is neither an address nor a name a resolver takes.
var ErrNotHost = errors.New("is neither a host name nor an address")

// CheckAddr returns a *RefusedError when the policy refuses ip, else nil.
func (p *Policy) CheckAddr(ip netip.Addr) error {
	ip = ip.WithZone("")
	if p.allows(ip) {
		return nil
	}
	if c, r := classify(ip); c != "" {
		return &RefusedError{Addr: ip, Class: c, Range: r}
	}
	return nil
}

func (p *Policy) allows(ip netip.Addr) bool {
	if p == nil {
		return false
	}
	for _, a := range p.allow {
		if a.Contains(ip) || (ip.Is4In6() && a.Contains(ip.Unmap())) {
			return true
		}
	}
	return false
}

// localNames are names every resolver answers with the local machine.
var localNames = []string{"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}

// CheckHost checks a host as a tenant wrote it (a URL's host, without its port; brackets
// allowed around an IPv6 address). An address in any spelling a resolver accepts (ParseHost)
// is judged as that address; a name of the local machine (localhost, *.localhost) as loopback;
// another name passes, to be judged at each connection by what it resolved to. A host that is
// neither (ends in a number but is no address, holds characters no name holds) is refused with
// an error wrapping ErrNotHost.
func (p *Policy) CheckHost(host string) error {
	ip, err := ParseHost(host)
	if err != nil {
		return err
	}
	if ip.IsValid() {
		if err := p.CheckAddr(ip); err != nil {
			r := err.(*RefusedError)
			r.Host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
			return r
		}
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if slices.Contains(localNames, name) || strings.HasSuffix(name, ".localhost") {
		for _, ip := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
			if p.CheckAddr(ip) == nil {
				return nil
			}
		}
		return &RefusedError{Host: host, Addr: netip.MustParseAddr("127.0.0.1"), Class: "the local machine", Range: netip.MustParsePrefix("127.0.0.0/8")}
	}
	return nil
}

// CheckURL checks an absolute URL's host with CheckHost. A URL with a backslash or a control
// character is refused: parsers disagree on where its host is.
func (p *Policy) CheckURL(raw string) error {
	if i := strings.IndexFunc(raw, func(r rune) bool { return r == '\\' || r <= ' ' || r == 0x7f }); i >= 0 {
		return fmt.Errorf("%q holds %q, which URL parsers read differently: %w", raw, raw[i], ErrNotHost)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", raw, ErrNotHost)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host: %w", raw, ErrNotHost)
	}
	return p.CheckHost(u.Hostname())
}
