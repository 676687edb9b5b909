package netpolicy_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/netpolicy"
)

// TestHostsAreReadAsTheResolverReadsThem: every spelling the issue names, and their kin, is the
// address it stands for, and refused as that address, naming what it is.
func TestHostsAreReadAsTheResolverReadsThem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ host, addr, class string }{
		{"127.1", "127.0.0.1", "loopback"},
		{"0x7f000001", "127.0.0.1", "loopback"},
		{"0X7F.1", "127.0.0.1", "loopback"},
		{"2130706433", "127.0.0.1", "loopback"},
		{"017700000001", "127.0.0.1", "loopback"},
		{"0", "0.0.0.0", "unspecified"},
		{"0.0.0.0", "0.0.0.0", "unspecified"},
		{"127.000.000.001", "127.0.0.1", "loopback"},
		{"0177.0.0.1", "127.0.0.1", "loopback"},
		{"127.0.1", "127.0.0.1", "loopback"},
		{"127.0.0.1.", "127.0.0.1", "loopback"},
		{"169.254.169.254", "169.254.169.254", "link-local"},
		{"0xa9fea9fe", "169.254.169.254", "link-local"},
		{"10.1", "10.0.0.1", "private"},
		{"192.168.1", "192.168.0.1", "private"},
		{"100.64.0.1", "100.64.0.1", "carrier-grade NAT"},
		{"192.0.2.1", "192.0.2.1", "documentation"},
		{"198.51.100.7", "198.51.100.7", "documentation"},
		{"203.0.113.9", "203.0.113.9", "documentation"},
		{"255.255.255.255", "255.255.255.255", "broadcast"},
		{"4294967295", "255.255.255.255", "broadcast"},
		{"224.0.0.1", "224.0.0.1", "multicast"},
		{"::1", "::1", "loopback"},
		{"[::1]", "::1", "loopback"},
		{"0000:0000::0002", "::2", "IPv4-compatible"},
		{"[0000:0000::0002]", "::2", "IPv4-compatible"},
		{"::", "::", "unspecified"},
		{"::ffff:127.0.0.1", "::ffff:127.0.0.1", "IPv4-mapped"},
		{"::ffff:8.8.8.8", "::ffff:8.8.8.8", "IPv4-mapped"},
		{"64:ff9b::7f00:1", "64:ff9b::7f00:1", "NAT64"},
		{"64:ff9b::8.8.8.8", "64:ff9b::808:808", "NAT64"},
		{"2002:7f00:1::", "2002:7f00:1::", "6to4"},
		{"fec0::1", "fec0::1", "site-local"},
		{"fe80::1%eth0", "fe80::1", "link-local"},
		{"fd00::1", "fd00::1", "unique-local"},
		{"ff02::1", "ff02::1", "multicast"},
		{"2001:db8::1", "2001:db8::1", "documentation"},
		{"2001::1", "2001::1", "Teredo"},
		{"4000::1", "4000::1", "reserved"},
	} {
		ip, err := netpolicy.ParseHost(c.host)
		if err != nil || ip.WithZone("") != netip.MustParseAddr(c.addr) {
			t.Errorf("ParseHost(%q) = %v, %v; want %s", c.host, ip, err, c.addr)
		}
		var r *netpolicy.RefusedError
		err = (*netpolicy.Policy)(nil).CheckHost(c.host)
		if !errors.As(err, &r) || !strings.Contains(err.Error(), c.class) {
			t.Errorf("CheckHost(%q) = %v; want refused as %s", c.host, err, c.class)
		}
	}
	for _, h := range []string{"8.8.8.8", "134744072", "0x08080808", "010.010.010.010", "2606:4700:4700::1111", "[2a01:4f8::1]",
		"example.com", "api.hetzner.cloud", "127.0.0.1.nip.io", "x_y.example.", "172.32.0.1", "100.128.0.1"} {
		if err := (*netpolicy.Policy)(nil).CheckHost(h); err != nil {
			t.Errorf("CheckHost(%q) = %v; want accepted", h, err)
		}
	}
	for _, h := range []string{"localhost", "LOCALHOST.", "a.localhost", "ip6-localhost"} {
		if err := (*netpolicy.Policy)(nil).CheckHost(h); err == nil || !strings.Contains(err.Error(), "local machine") {
			t.Errorf("CheckHost(%q) = %v; want refused as the local machine", h, err)
		}
	}
	for _, h := range []string{"", ".", "1.2.3.256", "08", "1.2.3.4.5", "a.1", "0x1.0x100.1.1", "::ffff:127.1", "[127.0.0.1]",
		"exa mple.com", "exa%6dple.com", "ex\u0430mple.com", "１２７.０.０.１", "a..b", ":::1"} {
		if _, err := netpolicy.ParseHost(h); !errors.Is(err, netpolicy.ErrNotHost) {
			t.Errorf("ParseHost(%q) = %v; want ErrNotHost", h, err)
		}
	}
}

// TestAllowedRangesAreAllowedAsWritten: an operator's range opens exactly itself, an IPv4 range
// its mapped form too, and nothing else of its class.
func TestAllowedRangesAreAllowedAsWritten(t *testing.T) {
	t.Parallel()
	p, err := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("127.0.0.0/8")})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"10.20.1.1", "::ffff:10.20.1.1", "127.1", "localhost"} {
		if err := p.CheckHost(h); err != nil {
			t.Errorf("allowed %v: CheckHost(%q) = %v", p.Allowed(), h, err)
		}
	}
	for _, h := range []string{"10.21.0.1", "192.168.0.1", "::1", "64:ff9b::a14:101"} {
		if err := p.CheckHost(h); err == nil {
			t.Errorf("allowed %v: CheckHost(%q) accepted", p.Allowed(), h)
		}
	}
	if _, err := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")}); err == nil || !strings.Contains(err.Error(), "10.0.0.0/8") {
		t.Errorf("a range with host bits: %v", err)
	}
	all, _ := netpolicy.New(netpolicy.AllRanges)
	for _, h := range []string{"127.1", "::1", "localhost", "169.254.169.254", "64:ff9b::1"} {
		if err := all.CheckHost(h); err != nil {
			t.Errorf("every range allowed: CheckHost(%q) = %v", h, err)
		}
	}
}

// TestCheckURLReadsTheHostGoReads refuses what parsers read differently and checks the host.
func TestCheckURLReadsTheHostGoReads(t *testing.T) {
	t.Parallel()
	var p *netpolicy.Policy
	for _, u := range []string{"http://127.1/", "https://0x7f000001:8443/x", "http://[0000:0000::0002]/", "http://[::ffff:a9fe:a9fe]/latest",
		"http://evil.example\\@127.0.0.1/", "http://a b/", "https:///path", "http://localhost:80"} {
		if err := p.CheckURL(u); err == nil {
			t.Errorf("CheckURL(%q) accepted", u)
		}
	}
	if err := p.CheckURL("https://hooks.example.com/compute?x=1"); err != nil {
		t.Errorf("a public URL: %v", err)
	}
}

// TestEverySpellingOfAnAddressIsThatAddress is the property over spellings: any address, written
// in any of the forms a resolver accepts, reads as itself, and is refused exactly when the
// address is.
func TestEverySpellingOfAnAddressIsThatAddress(t *testing.T) {
	t.Parallel()
	var p *netpolicy.Policy
	rapid.Check(t, func(t *rapid.T) {
		sp := spelling().Draw(t, "spelling")
		ip, host := sp.Addr, sp.string
		got, err := netpolicy.ParseHost(host)
		if err != nil || got.WithZone("") != ip {
			t.Fatalf("ParseHost(%q) = %v, %v; want %s", host, got, err, ip)
		}
		byHost, byAddr := p.CheckHost(host), p.CheckAddr(ip)
		if (byHost == nil) != (byAddr == nil) {
			t.Fatalf("%q is %s: CheckHost says %v, CheckAddr %v", host, ip, byHost, byAddr)
		}
		// The connection's check agrees with the creation's.
		if ctl := p.Control("tcp", netip.AddrPortFrom(ip, 443).String(), nil); (ctl == nil) != (byAddr == nil) {
			t.Fatalf("%s: Control says %v, CheckAddr %v", ip, ctl, byAddr)
		}
	})
}

// spelling draws an address, often of a refused class, and one way of writing it.
func spelling() *rapid.Generator[spelled] {
	return rapid.Custom(func(t *rapid.T) spelled {
		if rapid.Bool().Draw(t, "v6") {
			return spell6(t)
		}
		return spell4(t)
	})
}

type spelled = struct {
	netip.Addr
	string
}

// interesting are addresses on the edges of the classes.
var interesting = []string{"127.0.0.1", "0.0.0.0", "10.0.0.0", "10.255.255.255", "169.254.169.254", "172.16.0.1", "172.31.255.255",
	"172.32.0.0", "192.0.2.0", "192.0.3.0", "100.64.0.0", "100.127.255.255", "100.128.0.0", "198.18.0.0", "198.20.0.0",
	"224.0.0.0", "239.255.255.255", "240.0.0.0", "255.255.255.255", "8.8.8.8", "1.1.1.1", "11.0.0.0", "9.255.255.255"}

func spell4(t *rapid.T) spelled {
	var a [4]byte
	if rapid.Bool().Draw(t, "edge") {
		a = netip.MustParseAddr(rapid.SampledFrom(interesting).Draw(t, "addr")).As4()
	} else {
		copy(a[:], rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(t, "bytes"))
	}
	ip := netip.AddrFrom4(a)
	v := uint64(a[0])<<24 | uint64(a[1])<<16 | uint64(a[2])<<8 | uint64(a[3])
	n := rapid.IntRange(1, 4).Draw(t, "parts")
	parts := make([]string, n)
	for i := range n - 1 {
		parts[i] = number(t, uint64(a[i]))
	}
	parts[n-1] = number(t, v&(1<<(8*(5-n))-1))
	host := strings.Join(parts, ".")
	if rapid.Bool().Draw(t, "dot") {
		host += "."
	}
	return spelled{ip, host}
}

// number writes n in decimal, octal (0-led) or hex (0x), with leading zeros.
func number(t *rapid.T, n uint64) string {
	zeros := strings.Repeat("0", rapid.IntRange(0, 3).Draw(t, "zeros"))
	switch rapid.IntRange(0, 2).Draw(t, "base") {
	case 1:
		return "0" + zeros + fmt.Sprintf("%o", n)
	case 2:
		x := rapid.SampledFrom([]string{"0x", "0X"}).Draw(t, "x")
		s := fmt.Sprintf("%x", n)
		if rapid.Bool().Draw(t, "upper") {
			s = strings.ToUpper(s)
		}
		return x + zeros + s
	}
	return fmt.Sprint(n)
}

func spell6(t *rapid.T) spelled {
	var a [16]byte
	switch rapid.IntRange(0, 3).Draw(t, "kind") {
	case 0:
		copy(a[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "bytes"))
	case 1: // a prefix of a class, the rest random
		pre := rapid.SampledFrom([]string{"::", "::ffff:0:0", "64:ff9b::", "2002::", "fec0::", "fe80::", "fc00::", "ff00::", "2001:db8::", "2001::", "2606:4700::"}).Draw(t, "prefix")
		copy(a[:], netip.MustParseAddr(pre).AsSlice())
		for i := 10; i < 16; i++ {
			a[i] = rapid.Byte().Draw(t, "b")
		}
	case 2:
		a[15] = rapid.Byte().Draw(t, "low")
	case 3:
		copy(a[:], netip.MustParseAddr(rapid.SampledFrom([]string{"::1", "::", "::2", "::ffff:7f00:1", "2606:4700:4700::1111"}).Draw(t, "addr")).AsSlice())
	}
	ip := netip.AddrFrom16(a)
	var host string
	switch rapid.IntRange(0, 2).Draw(t, "form") {
	case 0:
		host = ip.String()
	case 1: // every group, with leading zeros
		gs := make([]string, 8)
		for i := range gs {
			gs[i] = fmt.Sprintf("%0*x", rapid.IntRange(1, 4).Draw(t, "width"), uint16(a[2*i])<<8|uint16(a[2*i+1]))
		}
		host = strings.Join(gs, ":")
	case 2: // the last 32 bits dotted
		gs := make([]string, 6)
		for i := range gs {
			gs[i] = fmt.Sprintf("%04x", uint16(a[2*i])<<8|uint16(a[2*i+1]))
		}
		host = strings.Join(gs, ":") + ":" + netip.AddrFrom4([4]byte(a[12:])).String()
	}
	if rapid.Bool().Draw(t, "upper") {
		host = strings.ToUpper(host)
	}
	if rapid.Bool().Draw(t, "brackets") {
		host = "[" + host + "]"
	}
	return spelled{ip, host}
}
