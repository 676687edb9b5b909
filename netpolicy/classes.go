package netpolicy

import "net/netip"

// class is a range the policy refuses unless allowed, and what it is.
type class struct {
	r    netip.Prefix
	name string
}

func c(r, name string) class { return class{netip.MustParsePrefix(r), name} }

// classes are the ranges no public endpoint has (IANA's special-purpose registries, RFC 6890 and
// after), the more specific first: the first that holds an address names its class.
var classes = []class{
	// IPv4.
	c("0.0.0.0/32", "the unspecified address"),
	c("0.0.0.0/8", `a "this network" address`),
	c("10.0.0.0/8", "a private address"),
	c("100.64.0.0/10", "a carrier-grade NAT address"),
	c("127.0.0.0/8", "a loopback address"),
	c("169.254.0.0/16", "a link-local address (cloud metadata services live there)"),
	c("172.16.0.0/12", "a private address"),
	c("192.0.0.0/24", "an IETF protocol assignment"),
	c("192.0.2.0/24", "a documentation address"),
	c("192.31.196.0/24", "an AS112 address"),
	c("192.52.193.0/24", "an AMT address"),
	c("192.88.99.0/24", "a 6to4 relay address"),
	c("192.168.0.0/16", "a private address"),
	c("192.175.48.0/24", "an AS112 address"),
	c("198.18.0.0/15", "a benchmarking address"),
	c("198.51.100.0/24", "a documentation address"),
	c("203.0.113.0/24", "a documentation address"),
	c("224.0.0.0/4", "a multicast address"),
	c("255.255.255.255/32", "the broadcast address"),
	c("240.0.0.0/4", "a reserved address"),
	// IPv6.
	c("::/128", "the unspecified address"),
	c("::1/128", "a loopback address"),
	c("::ffff:0:0/96", "an IPv4-mapped address (write the IPv4 address)"),
	c("::ffff:0:0:0/96", "an IPv4-translated address"),
	c("::/96", "an IPv4-compatible address"),
	c("64:ff9b::/96", "a NAT64 address (it reaches an IPv4 address through a translator)"),
	c("64:ff9b:1::/48", "a local NAT64 address"),
	c("100::/64", "a discard-only address"),
	c("2001:db8::/32", "a documentation address"),
	c("2001::/23", "an IETF protocol assignment (Teredo, ORCHID, benchmarking)"),
	c("2002::/16", "a 6to4 address (it embeds an IPv4 address)"),
	c("3fff::/20", "a documentation address"),
	c("5f00::/16", "a segment-routing address"),
	c("fc00::/7", "a unique-local (private) address"),
	c("fe80::/10", "a link-local address"),
	c("fec0::/10", "a site-local address"),
	c("ff00::/8", "a multicast address"),
}

// globalUnicast is the only IPv6 range with public unicast addresses; the rest is reserved.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// classify names the class of a refused range that holds ip, or "" for a public address.
func classify(ip netip.Addr) (string, netip.Prefix) {
	for _, k := range classes {
		if k.r.Contains(ip) {
			return k.name, k.r
		}
	}
	if ip.Is6() && !globalUnicast.Contains(ip) {
		return "a reserved address", netip.PrefixFrom(ip, 3).Masked()
	}
	return "", netip.Prefix{}
}
