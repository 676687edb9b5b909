package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseHost reads host as a resolver will: the address it stands for, or the zero Addr for a
// name. IPv6 is the literal (brackets and a zone allowed); IPv4 is any spelling inet_aton and
// the WHATWG URL standard accept: one to four parts, each decimal, octal (a leading 0) or hex
// (0x), the last filling the bytes that remain (127.1, 0x7f000001, 2130706433, 017700000001,
// 0, 127.000.000.001), a final dot ignored. A host whose last label is a number but that is no
// address (1.2.3.256, 08), or that holds what no name holds, is an error wrapping ErrNotHost:
// resolvers disagree on such hosts, so none is taken.
func ParseHost(host string) (netip.Addr, error) {
	bad := func(why string) (netip.Addr, error) {
		return netip.Addr{}, fmt.Errorf("%q %w: %s", host, ErrNotHost, why)
	}
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
		if !strings.Contains(h, ":") {
			return bad("brackets hold an IPv6 address")
		}
	}
	if strings.Contains(h, ":") {
		ip, err := netip.ParseAddr(h)
		if err != nil || !ip.Is6() {
			return bad("it holds a colon but is no IPv6 address")
		}
		return ip, nil
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return bad("it is empty")
	}
	if len(h) > 253 {
		return bad("a name is at most 253 characters")
	}
	labels := strings.Split(h, ".")
	if number(labels[len(labels)-1]) {
		ip, ok := parseIPv4(labels)
		if !ok {
			return bad("it ends in a number, so it must be an IPv4 address, and is none")
		}
		return ip, nil
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return bad("a name's labels are 1 to 63 characters")
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return bad("a name holds only letters, digits, '-' and '_' (an internationalized name in its xn-- form)")
			}
		}
	}
	return netip.Addr{}, nil
}

// number reports whether a label is a number as the URL standard reads one: digits, or 0x and
// hex digits.
func number(l string) bool {
	if l == "" {
		return false
	}
	if hex, ok := strings.CutPrefix(strings.ToLower(l), "0x"); ok {
		return strings.Trim(hex, "0123456789abcdef") == ""
	}
	return strings.Trim(l, "0123456789") == ""
}

// parseIPv4 reads inet_aton's forms: up to four parts, all but the last one byte each, the last
// the bytes that remain.
func parseIPv4(parts []string) (netip.Addr, bool) {
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint64
	for i, p := range parts {
		n, ok := parsePart(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 0xff {
				return netip.Addr{}, false
			}
			v |= n << (8 * (3 - i))
			continue
		}
		if n >= 1<<(8*(4-i)) {
			return netip.Addr{}, false
		}
		v |= n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parsePart reads one part: 0x hex (0x alone is 0), 0-led octal, or decimal; at most 32 bits.
func parsePart(p string) (uint64, bool) {
	base, digits := uint64(10), p
	switch {
	case len(p) >= 2 && (p[:2] == "0x" || p[:2] == "0X"):
		base, digits = 16, p[2:]
	case len(p) >= 2 && p[0] == '0':
		base, digits = 8, p[1:]
	case p == "":
		return 0, false
	}
	var n uint64
	for _, r := range strings.ToLower(digits) {
		var d uint64
		switch {
		case r >= '0' && r <= '9':
			d = uint64(r - '0')
		case r >= 'a' && r <= 'f':
			d = uint64(r-'a') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		n = n*base + d
		if n > 0xffffffff {
			return 0, false
		}
	}
	return n, true
}
