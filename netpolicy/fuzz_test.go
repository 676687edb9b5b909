package netpolicy_test

import (
	"net"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/better-compute/compute/netpolicy"
)

// FuzzCheckURL: no URL the default policy accepts has a host that a resolver reads as a refused
// address. The oracles are independent of the package: Go's own parsers (net.ParseIP, netip)
// and inet_aton written again here, differently. Its seed corpus (testdata/fuzz/FuzzCheckURL)
// runs with every go test; `go test -fuzz FuzzCheckURL ./netpolicy` searches further.
func FuzzCheckURL(f *testing.F) {
	for _, s := range []string{"//[0000:0000::0002]", "http://127.1/", "https://0x7f000001/", "http://2130706433/", "http://017700000001/",
		"http://0/", "http://127.000.000.001/", "http://[::ffff:127.0.0.1]/", "https://hooks.example.com/x", "http://192.0.2.1/",
		"//[64:ff9b::7f00:1]", "//[2002:7f00:1::]", "//[fec0::1]", "//0x7f.1", "//localhost."} {
		f.Add(s)
	}
	var p *netpolicy.Policy
	f.Fuzz(func(t *testing.T, s string) {
		for _, raw := range []string{s, "https:" + s, "https://" + s} {
			u, err := url.Parse(raw)
			if err != nil || u.Host == "" {
				continue
			}
			if p.CheckURL(raw) != nil {
				continue
			}
			host := u.Hostname()
			for name, ip := range map[string]netip.Addr{"net.ParseIP": goParse(host), "inet_aton": inetAton(host)} {
				if ip.IsValid() && p.CheckAddr(ip) != nil {
					t.Fatalf("CheckURL accepts %q, whose host %q %s reads as %s, which the policy refuses", raw, host, name, ip)
				}
			}
			if h := strings.TrimSuffix(strings.ToLower(host), "."); h == "localhost" || strings.HasSuffix(h, ".localhost") {
				t.Fatalf("CheckURL accepts %q, which names the local machine", raw)
			}
		}
	})
}

func goParse(host string) netip.Addr {
	ip, ok := netip.AddrFromSlice(net.ParseIP(strings.SplitN(host, "%", 2)[0]))
	if !ok {
		return netip.Addr{}
	}
	if !strings.Contains(host, ":") {
		return ip.Unmap() // net.IP holds IPv4 in 16 bytes
	}
	return ip
}

// inetAton is glibc's inet_aton as its manual describes it, written without the package's code:
// a.b.c.d, a.b.c (c 16 bits), a.b (b 24 bits), a (32 bits); each part 0x hex, 0 octal or decimal.
func inetAton(host string) netip.Addr {
	host = strings.TrimSuffix(host, ".")
	parts := strings.Split(host, ".")
	if len(parts) == 0 || len(parts) > 4 {
		return netip.Addr{}
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := uint64(10)
		if strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X") {
			base, p = 16, p[2:]
		} else if len(p) > 1 && p[0] == '0' {
			base, p = 8, p[1:]
		} else if p == "" {
			return netip.Addr{}
		}
		var v uint64
		for _, r := range p {
			if r < '0' {
				return netip.Addr{}
			}
			d := uint64(strings.IndexRune("0123456789abcdef", r|0x20))
			if r >= '0' && r <= '9' {
				d = uint64(r - '0')
			}
			if d >= base {
				return netip.Addr{}
			}
			if v = v*base + d; v > 1<<32 {
				return netip.Addr{}
			}
		}
		vals[i] = v
	}
	var v uint64
	last := len(vals) - 1
	for i := range last {
		if vals[i] > 255 {
			return netip.Addr{}
		}
		v |= vals[i] << (24 - 8*i)
	}
	if vals[last] >= 1<<(32-8*last) {
		return netip.Addr{}
	}
	v |= vals[last]
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
