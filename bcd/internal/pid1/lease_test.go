package pid1

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/rfc1035label"
)

func ack(t *testing.T, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	base := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(dhcpv4.MessageTypeAck),
		dhcpv4.WithYourIP(net.IPv4(10, 0, 2, 15)),
		dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
		dhcpv4.WithRouter(net.IPv4(10, 0, 2, 2)),
		dhcpv4.WithDNS(net.IPv4(10, 0, 2, 3), net.IPv4(10, 0, 2, 3), net.IPv4(1, 1, 1, 1)),
		dhcpv4.WithOption(dhcpv4.OptDomainName("lab.example")),
		dhcpv4.WithOption(dhcpv4.OptDomainSearch(&rfc1035label.Labels{Labels: []string{"lab.example", "example"}})),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 2, 2))),
		dhcpv4.WithLeaseTime(3600),
		dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(1200 * time.Second)),
	}
	m, err := dhcpv4.New(append(base, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLeaseFromACK reads what a DHCPACK gives: the address with its subnet's length, the first
// router, the DNS servers once each, the domain and search list, the server, how long it lasts
// and when to renew it.
func TestLeaseFromACK(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got, err := leaseFromACK(ack(t), "eth0", now)
	if err != nil {
		t.Fatal(err)
	}
	want := Lease{Link: "eth0", Address: netip.MustParsePrefix("10.0.2.15/24"), Gateway: netip.MustParseAddr("10.0.2.2"),
		DNS:    []netip.Addr{netip.MustParseAddr("10.0.2.3"), netip.MustParseAddr("1.1.1.1")},
		Search: []string{"lab.example", "example"}, Server: netip.MustParseAddr("10.0.2.2"),
		Acquired: now, Duration: time.Hour, RenewAfter: 20 * time.Minute}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmpopts.IgnoreUnexported(Lease{})); d != "" {
		t.Errorf("lease (-want +got):\n%s", d)
	}
	if at := got.renewAt(); !at.Equal(now.Add(20 * time.Minute)) {
		t.Errorf("renewAt = %v, want T1 = 20 minutes on", at)
	}
	if at := got.expires(); !at.Equal(now.Add(time.Hour)) {
		t.Errorf("expires = %v, want an hour on", at)
	}

	forever, err := leaseFromACK(ack(t, dhcpv4.WithLeaseTime(0xffffffff)), "eth0", now)
	if err != nil {
		t.Fatal(err)
	}
	if forever.Duration != 0 || !forever.renewAt().IsZero() || !forever.expires().IsZero() {
		t.Errorf("an infinite lease: duration %v, renew at %v, expires %v; want none", forever.Duration, forever.renewAt(), forever.expires())
	}
	noT1, err := leaseFromACK(ack(t, dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(2*time.Hour))), "eth0", now)
	if err != nil {
		t.Fatal(err)
	}
	if at := noT1.renewAt(); !at.Equal(now.Add(30 * time.Minute)) {
		t.Errorf("a T1 past the lease's end: renewAt = %v, want half the lease", at)
	}
	bare, err := leaseFromACK(ack(t, dhcpv4.WithoutOption(dhcpv4.OptionRouter), dhcpv4.WithoutOption(dhcpv4.OptionDomainNameServer)), "eth1", now)
	if err != nil {
		t.Fatal(err)
	}
	if bare.Gateway.IsValid() || len(bare.DNS) != 0 {
		t.Errorf("a lease without router or DNS: gateway %v, DNS %v", bare.Gateway, bare.DNS)
	}
}

// TestLeaseFromACKRefuses an answer without an address to configure.
func TestLeaseFromACKRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  dhcpv4.Modifier
		want string
	}{
		{"no address", dhcpv4.WithYourIP(net.IPv4zero), "gives no usable address"},
		{"broadcast", dhcpv4.WithYourIP(net.IPv4bcast), "gives no usable address"},
		{"loopback", dhcpv4.WithYourIP(net.IPv4(127, 0, 0, 1)), "gives no usable address"},
		{"no mask", dhcpv4.WithoutOption(dhcpv4.OptionSubnetMask), "has no usable subnet mask"},
		{"zero mask", dhcpv4.WithNetmask(net.CIDRMask(0, 32)), "has no usable subnet mask"},
		{"holed mask", dhcpv4.WithNetmask(net.IPMask{255, 0, 255, 0}), "has no usable subnet mask"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := leaseFromACK(ack(t, tc.mod), "eth0", time.Now())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("leaseFromACK = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := leaseFromACK(nil, "eth0", time.Now()); err == nil {
		t.Error("leaseFromACK(nil) gave a lease")
	}
}

// TestResolvConf writes the lease's DNS servers (three at most) and search list.
func TestResolvConf(t *testing.T) {
	t.Parallel()
	l := testLease("eth0", "10.0.2.15/24")
	l.DNS = append(l.DNS, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"))
	l.Search = []string{"a.example", "b.example"}
	want := "# written by bcd init from the DHCP lease on eth0\nnameserver 10.0.2.3\nnameserver 10.0.0.1\nnameserver 10.0.0.2\nsearch a.example b.example\n"
	if got := string(resolvConf(l)); got != want {
		t.Errorf("resolv.conf = %q, want %q", got, want)
	}
	l.DNS, l.Search = nil, nil
	if got := string(resolvConf(l)); got != "# written by bcd init from the DHCP lease on eth0\n" {
		t.Errorf("resolv.conf without DNS = %q", got)
	}
}
