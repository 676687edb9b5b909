package pid1

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// infiniteLease is DHCP's "for ever" (RFC 2132 9.2: 0xffffffff seconds).
const infiniteLease = math.MaxUint32 * time.Second

// leaseFromACK reads a server's DHCPACK as a Lease on link, acknowledged at now. It refuses
// an answer without a usable address or subnet mask: there would be nothing to configure.
func leaseFromACK(ack *dhcpv4.DHCPv4, link string, now time.Time) (Lease, error) {
	if ack == nil {
		return Lease{}, errors.New("no DHCPACK")
	}
	ip, ok := addr4(ack.YourIPAddr)
	if !ok || !ip.IsGlobalUnicast() {
		return Lease{}, fmt.Errorf("the DHCPACK gives no usable address (yiaddr %v)", ack.YourIPAddr)
	}
	mask := ack.SubnetMask()
	ones, bits := mask.Size()
	if mask == nil || bits != 32 || ones == 0 {
		return Lease{}, fmt.Errorf("the DHCPACK for %v has no usable subnet mask (option 1: %v)", ip, mask)
	}
	l := Lease{Link: link, Address: netip.PrefixFrom(ip, ones), Acquired: now}
	for _, r := range ack.Router() {
		if a, ok := addr4(r); ok && !a.IsUnspecified() {
			l.Gateway = a
			break
		}
	}
	for _, d := range ack.DNS() {
		if a, ok := addr4(d); ok && !a.IsUnspecified() && !slices.Contains(l.DNS, a) {
			l.DNS = append(l.DNS, a)
		}
	}
	if name := strings.TrimSpace(ack.DomainName()); name != "" && !strings.ContainsAny(name, " \t\n") {
		l.Search = append(l.Search, name)
	}
	if labels := ack.DomainSearch(); labels != nil {
		for _, name := range labels.Labels {
			if name != "" && !strings.ContainsAny(name, " \t\n") && !slices.Contains(l.Search, name) {
				l.Search = append(l.Search, name)
			}
		}
	}
	if s, ok := addr4(ack.ServerIdentifier()); ok {
		l.Server = s
	}
	if d := ack.IPAddressLeaseTime(0); d > 0 && d < infiniteLease {
		l.Duration = d
		l.RenewAfter = ack.IPAddressRenewalTime(0)
	}
	return l, nil
}

func addr4(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip.To4())
	return a, ok && a.Is4()
}

// resolvConf is /etc/resolv.conf for a lease: its DNS servers (three at most: the C library's
// limit, which Go's resolver keeps) and its search list.
func resolvConf(l Lease) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# written by bcd init from the DHCP lease on %s\n", l.Link)
	for i, d := range l.DNS {
		if i == 3 {
			break
		}
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	if len(l.Search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(l.Search, " "))
	}
	return []byte(b.String())
}

// prefixNet is a prefix as the *net.IPNet netlink takes.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
