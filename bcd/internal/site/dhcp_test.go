package site

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/better-compute/compute/metal/siteapi"
)

// These tests give the DHCP handler packets built with the library and read its answers: every
// branch of the boot decision without root. netns_test.go sends real ones over a veth pair.

var (
	siteAddr = netip.MustParseAddr("192.0.2.1")
	siteBase = "http://192.0.2.1:8067"
	bcast    = "255.255.255.255:68"
)

func dhcpServer(t *testing.T, dhcp DHCPConfig, plan *siteapi.Plan) *Server {
	t.Helper()
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.Interface, cfg.Address, cfg.DHCP = "site0", siteAddr, dhcp
	cfg.HTTPAddr, cfg.TFTPAddr = "", "" // on Address: never listened on here
	s, err := New(cfg)
	must(t, err)
	s.addrs.BaseURL = siteBase // as Run sets it
	if plan != nil {
		must(t, s.SetPlan(*plan))
	}
	return s
}

func planOf(unknown string) *siteapi.Plan { p := testPlan(unknown); return &p }

func hw(mac string) net.HardwareAddr {
	h, err := net.ParseMAC(mac)
	if err != nil {
		panic(err)
	}
	return h
}

var guid = append([]byte{0}, bytes.Repeat([]byte{0xab}, 16)...)

// pxe is a firmware PXE client's packet: class PXEClient, architecture, machine identifier.
func pxe(arch iana.Arch, typ dhcpv4.MessageType, mac string, more ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{
		dhcpv4.WithHwAddr(hw(mac)),
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid)),
	}, more...)...)
	if err != nil {
		panic(err)
	}
	return m
}

func plain(typ dhcpv4.MessageType, mac string, more ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(hw(mac)), dhcpv4.WithMessageType(typ)}, more...)...)
	if err != nil {
		panic(err)
	}
	return m
}

var ipxeClass = dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE"))

// TestProxyDHCP: proxy DHCP answers PXE clients the plan boots, with no address, the site as
// next-server, and iPXE (or, for iPXE, its script's URL); everything else gets no answer.
func TestProxyDHCP(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		plan *siteapi.Plan
		port int
		req  *dhcpv4.DHCPv4
		peer *net.UDPAddr
		typ  dhcpv4.MessageType // MessageTypeNone: no answer
		file string
		dest string
	}{
		{"BIOS", planOf(siteapi.UnknownIgnore), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeOffer, BIOSBinary, bcast},
		{"UEFI x86-64", planOf(siteapi.UnknownIgnore), 67, pxe(iana.EFI_X86_64, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeOffer, EFIBinarySNP, bcast},
		{"UEFI BC", planOf(siteapi.UnknownIgnore), 67, pxe(iana.EFI_BC, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeOffer, EFIBinarySNP, bcast},
		{"a disk machine gets iPXE too", planOf(siteapi.UnknownIgnore), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macDisk), nil, dhcpv4.MessageTypeOffer, BIOSBinary, bcast},
		{"iPXE", planOf(siteapi.UnknownIgnore), 67, pxe(iana.EFI_X86_64, dhcpv4.MessageTypeDiscover, macRamdisk, ipxeClass), nil, dhcpv4.MessageTypeOffer, siteBase + "/boot/ipxe?mac=" + macRamdisk, bcast},
		{"iPXE, RFC 3004 user class", planOf(siteapi.UnknownIgnore), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macRamdisk,
			dhcpv4.WithOption(dhcpv4.OptRFC3004UserClass([]string{"iPXE"}))), nil, dhcpv4.MessageTypeOffer, siteBase + "/boot/ipxe?mac=" + macRamdisk, bcast},
		{"unknown, inspect", planOf(siteapi.UnknownInspect), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macUnknown), nil, dhcpv4.MessageTypeOffer, BIOSBinary, bcast},
		{"unknown, ignore", planOf(siteapi.UnknownIgnore), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macUnknown), nil, dhcpv4.MessageTypeNone, "", ""},
		{"no plan yet", nil, 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeNone, "", ""},
		{"ARM64: no iPXE for it", planOf(siteapi.UnknownInspect), 67, pxe(iana.EFI_ARM64, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeNone, "", ""},
		{"not a PXE client", planOf(siteapi.UnknownInspect), 67, plain(dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeNone, "", ""},
		{"a request on 67 is the DHCP server's", planOf(siteapi.UnknownInspect), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeRequest, macRamdisk), nil, dhcpv4.MessageTypeNone, "", ""},
		{"relayed", planOf(siteapi.UnknownInspect), 67, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macRamdisk,
			dhcpv4.WithGatewayIP(net.ParseIP("198.51.100.1"))), nil, dhcpv4.MessageTypeOffer, BIOSBinary, "198.51.100.1:67"},
		{"4011 request", planOf(siteapi.UnknownInspect), pxePort, pxe(iana.EFI_X86_64, dhcpv4.MessageTypeRequest, macRamdisk,
			dhcpv4.WithClientIP(net.ParseIP("192.0.2.50"))), &net.UDPAddr{IP: net.ParseIP("192.0.2.50"), Port: 68}, dhcpv4.MessageTypeAck, EFIBinarySNP, "192.0.2.50:68"},
		{"4011 request from iPXE", planOf(siteapi.UnknownInspect), pxePort, pxe(iana.EFI_X86_64, dhcpv4.MessageTypeRequest, macRamdisk, ipxeClass,
			dhcpv4.WithClientIP(net.ParseIP("192.0.2.50"))), &net.UDPAddr{IP: net.ParseIP("192.0.2.50"), Port: 68}, dhcpv4.MessageTypeAck, siteBase + "/boot/ipxe?mac=" + macRamdisk, "192.0.2.50:68"},
		{"4011 discover", planOf(siteapi.UnknownInspect), pxePort, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macRamdisk), nil, dhcpv4.MessageTypeNone, "", ""},
		{"4011, unknown, ignore", planOf(siteapi.UnknownIgnore), pxePort, pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeRequest, macUnknown), nil, dhcpv4.MessageTypeNone, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := dhcpServer(t, DHCPConfig{Mode: DHCPProxy}, c.plan)
			resp, dest := s.answerDHCP(c.req, c.port, c.peer, time.Now())
			if c.typ == dhcpv4.MessageTypeNone {
				if resp != nil {
					t.Fatalf("answered %s", resp.Summary())
				}
				return
			}
			if resp == nil {
				t.Fatal("no answer")
			}
			// What goes on the wire is what the client reads.
			resp, err := dhcpv4.FromBytes(resp.ToBytes())
			must(t, err)
			checkPXE(t, c.req, resp, c.typ, c.file)
			if !resp.YourIPAddr.IsUnspecified() {
				t.Errorf("proxy DHCP gave an address: %v", resp.YourIPAddr)
			}
			if dest.String() != c.dest {
				t.Errorf("sent to %v, want %s", dest, c.dest)
			}
		})
	}
}

// checkPXE checks an answer's PXE part.
func checkPXE(t *testing.T, req, resp *dhcpv4.DHCPv4, typ dhcpv4.MessageType, file string) {
	t.Helper()
	if resp.MessageType() != typ || resp.OpCode != dhcpv4.OpcodeBootReply || resp.TransactionID != req.TransactionID ||
		!bytes.Equal(resp.ClientHWAddr, req.ClientHWAddr) {
		t.Errorf("answer %s does not match request %s", resp.Summary(), req.Summary())
	}
	if resp.BootFileName != file {
		t.Errorf("boot file %q, want %q", resp.BootFileName, file)
	}
	if !resp.ServerIPAddr.Equal(siteAddr.AsSlice()) || !resp.ServerIdentifier().Equal(siteAddr.AsSlice()) {
		t.Errorf("next-server %v, server identifier %v, want %v", resp.ServerIPAddr, resp.ServerIdentifier(), siteAddr)
	}
	if resp.ClassIdentifier() != "PXEClient" {
		t.Errorf("class %q, want PXEClient", resp.ClassIdentifier())
	}
	if v := resp.GetOneOption(dhcpv4.OptionVendorSpecificInformation); !bytes.HasPrefix(v, []byte{6, 1, 8}) || v[len(v)-1] != 255 {
		t.Errorf("vendor options % x, want discovery control 8 first", v)
	}
	if g := resp.GetOneOption(dhcpv4.OptionClientMachineIdentifier); !bytes.Equal(g, guid) {
		t.Errorf("machine identifier % x, want the client's echoed", g)
	}
}

// TestPXEBootItemEchoed: a 4011 request naming a boot item gets it back, as PXE asks.
func TestPXEBootItemEchoed(t *testing.T) {
	t.Parallel()
	s := dhcpServer(t, DHCPConfig{Mode: DHCPProxy}, planOf(siteapi.UnknownInspect))
	item := dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 4, 0x80, 0x00, 0x00, 0x00, 255}))
	resp, _ := s.answerDHCP(pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeRequest, macRamdisk, item), pxePort, &net.UDPAddr{IP: net.ParseIP("192.0.2.9"), Port: 68}, time.Now())
	if resp == nil {
		t.Fatal("no answer")
	}
	want := []byte{6, 1, 8, 71, 4, 0x80, 0, 0, 0, 255}
	if got := resp.GetOneOption(dhcpv4.OptionVendorSpecificInformation); !bytes.Equal(got, want) {
		t.Errorf("vendor options % x, want % x", got, want)
	}
}

func fullDHCP() DHCPConfig {
	return DHCPConfig{Mode: DHCPFull, Subnet: netip.MustParsePrefix("192.0.2.0/24"),
		RangeStart: netip.MustParseAddr("192.0.2.100"), RangeEnd: netip.MustParseAddr("192.0.2.101"),
		Router: siteAddr, DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, LeaseTime: 10 * time.Minute}
}

// TestFullDHCP: full DHCP's exchanges: addresses with the network's options, the boot file on
// top for a PXE client the plan boots, naks, another server's offer taken, release.
func TestFullDHCP(t *testing.T) {
	t.Parallel()
	s := dhcpServer(t, fullDHCP(), planOf(siteapi.UnknownIgnore))
	now := time.Now()
	ask := func(req *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
		t.Helper()
		resp, dest := s.answerDHCP(req, 67, nil, now)
		if resp == nil {
			return nil
		}
		if dest.String() != bcast {
			t.Errorf("sent to %v, want broadcast", dest)
		}
		resp, err := dhcpv4.FromBytes(resp.ToBytes())
		must(t, err)
		return resp
	}
	checkLease := func(resp *dhcpv4.DHCPv4, typ dhcpv4.MessageType, addr string) {
		t.Helper()
		if resp == nil || resp.MessageType() != typ || resp.YourIPAddr.String() != addr {
			t.Fatalf("got %v, want %s of %s", resp, typ, addr)
		}
		if net.IP(resp.SubnetMask()).String() != "255.255.255.0" || len(resp.Router()) != 1 || resp.Router()[0].String() != "192.0.2.1" ||
			len(resp.DNS()) != 1 || resp.IPAddressLeaseTime(0) != 10*time.Minute || !resp.ServerIdentifier().Equal(siteAddr.AsSlice()) {
			t.Errorf("network options: %s", resp.Summary())
		}
	}

	// A PC that is no PXE client: an address, no boot file.
	offer := ask(plain(dhcpv4.MessageTypeDiscover, macUnknown))
	checkLease(offer, dhcpv4.MessageTypeOffer, "192.0.2.100")
	if offer.BootFileName != "" || offer.ClassIdentifier() != "" {
		t.Errorf("a non-PXE client was given a boot file: %s", offer.Summary())
	}
	req := plain(dhcpv4.MessageTypeRequest, macUnknown, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("192.0.2.100"))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(siteAddr.AsSlice())))
	checkLease(ask(req), dhcpv4.MessageTypeAck, "192.0.2.100")

	// A machine of the plan PXE-booting: the next address and its boot file.
	offer = ask(pxe(iana.EFI_X86_64, dhcpv4.MessageTypeDiscover, macRamdisk))
	checkLease(offer, dhcpv4.MessageTypeOffer, "192.0.2.101")
	checkPXE(t, pxe(iana.EFI_X86_64, dhcpv4.MessageTypeDiscover, macRamdisk, dhcpv4.WithTransactionID(offer.TransactionID)), offer, dhcpv4.MessageTypeOffer, EFIBinarySNP)
	ack := ask(pxe(iana.EFI_X86_64, dhcpv4.MessageTypeRequest, macRamdisk, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("192.0.2.101")))))
	checkLease(ack, dhcpv4.MessageTypeAck, "192.0.2.101")
	if ack.BootFileName != EFIBinarySNP {
		t.Errorf("ack's boot file %q", ack.BootFileName)
	}

	// The range is used up: a third client gets nothing; one asking for a taken address a nak.
	if resp := ask(plain(dhcpv4.MessageTypeDiscover, macIdle)); resp != nil {
		t.Errorf("offered %v from a used-up range", resp.YourIPAddr)
	}
	nak := ask(plain(dhcpv4.MessageTypeRequest, macIdle, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("192.0.2.100")))))
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Errorf("request for another's address: %v, want a nak", nak)
	}
	nak = ask(plain(dhcpv4.MessageTypeRequest, macIdle, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("10.9.9.9")))))
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Errorf("request for an address of another network: %v, want a nak", nak)
	}

	// The first client releases its address: the third gets it; a request that chose another
	// server's offer gets no answer and frees the site's.
	ask(plain(dhcpv4.MessageTypeRelease, macUnknown, dhcpv4.WithClientIP(net.ParseIP("192.0.2.100"))))
	checkLease(ask(plain(dhcpv4.MessageTypeDiscover, macIdle)), dhcpv4.MessageTypeOffer, "192.0.2.100")
	if resp := ask(plain(dhcpv4.MessageTypeRequest, macIdle, dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("192.0.2.254"))),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP("192.0.2.77"))))); resp != nil {
		t.Errorf("answered a request for another server: %s", resp.Summary())
	}
	checkLease(ask(plain(dhcpv4.MessageTypeDiscover, macUnknown)), dhcpv4.MessageTypeOffer, "192.0.2.100")

	// A request relayed from another network: none of the range's addresses fits it.
	if resp := ask(plain(dhcpv4.MessageTypeDiscover, macDisk, dhcpv4.WithGatewayIP(net.ParseIP("198.51.100.1")))); resp != nil {
		t.Errorf("answered a discover relayed from another network: %s", resp.Summary())
	}

	// An unknown PXE client under ignore: an address, no boot file.
	s2 := dhcpServer(t, fullDHCP(), planOf(siteapi.UnknownIgnore))
	resp, _ := s2.answerDHCP(pxe(iana.INTEL_X86PC, dhcpv4.MessageTypeDiscover, macUnknown), 67, nil, now)
	if resp == nil || resp.YourIPAddr.String() != "192.0.2.100" || resp.BootFileName != "" {
		t.Errorf("unknown PXE client under ignore: %v, want an address and no boot file", resp)
	}
}

// TestLeaseTable: the lease table's rules: a MAC keeps its address, a lease is held until it
// expires, an offer is held briefly, a declined address rests.
func TestLeaseTable(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	lt := newLeaseTable(netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), time.Hour)
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	offer := func(mac string, want netip.Addr, at time.Time) string {
		got, ok := lt.offer(mac, want, at)
		if !ok {
			return "none"
		}
		return got.String()
	}
	if got := offer("m1", a("192.0.2.11"), t0); got != "192.0.2.11" {
		t.Errorf("asked for a free address: %s", got)
	}
	if got := offer("m1", netip.Addr{}, t0); got != "192.0.2.11" {
		t.Errorf("the same MAC again: %s", got)
	}
	if !lt.request("m1", a("192.0.2.11"), t0) {
		t.Fatal("request of the offered address refused")
	}
	if lt.request("m2", a("192.0.2.11"), t0) || lt.request("m2", a("192.0.2.12"), t0) || lt.request("m2", a("192.0.2.9"), t0) {
		t.Error("granted a held or out-of-range address")
	}
	if got := offer("m2", a("192.0.2.11"), t0); got != "192.0.2.10" {
		t.Errorf("m2 asking for m1's address: %s, want the free one", got)
	}
	if got := offer("m3", netip.Addr{}, t0.Add(time.Second)); got != "none" {
		t.Errorf("m3 while m2's offer is held: %s", got)
	}
	if got := offer("m3", netip.Addr{}, t0.Add(offerHold+time.Second)); got != "192.0.2.10" {
		t.Errorf("m3 once m2's offer lapsed: %s", got)
	}
	t2 := t0.Add(2 * time.Hour)
	if got := offer("m4", netip.Addr{}, t2); got != "192.0.2.10" {
		t.Errorf("m4 once m1's lease and m3's offer lapsed: %s, want the lowest lapsed address", got)
	}
	lt.decline("m4", a("192.0.2.10"), t2.Add(time.Second))
	if lt.request("m5", a("192.0.2.10"), t2.Add(2*time.Minute)) {
		t.Error("a declined address was granted at once")
	}
	if got := offer("m5", netip.Addr{}, t2.Add(2*time.Minute)); got != "192.0.2.11" {
		t.Errorf("offer while .10 rests: %s, want .11", got)
	}
	if !lt.request("m6", a("192.0.2.10"), t2.Add(declineHold+2*time.Minute)) {
		t.Error("a declined address was never granted again")
	}
	// A restart forgets the table: a client renewing an address nobody holds keeps it.
	lt = newLeaseTable(netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), time.Hour)
	if !lt.request("m1", a("192.0.2.11"), t0) {
		t.Error("a renewal after a restart was refused")
	}
}
