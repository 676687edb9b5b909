package site

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// serveDHCP answers the packets of one DHCP socket until it is closed. Packets are answered one
// at a time, in the loop: an answer is computed in memory and sent, nothing waits.
func (s *Server) serveDHCP(d *dhcpConn) error {
	buf := make([]byte, 4096)
	for {
		n, peer, err := d.conn.ReadFromUDP(buf)
		if err != nil {
			return ignoreClosed(err)
		}
		req, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			s.log.Debug("dhcp: not a DHCP packet", "from", peer, "err", err)
			continue
		}
		resp, dest := s.answerDHCP(req, d.port, peer, time.Now())
		if resp == nil {
			continue
		}
		if _, err := d.conn.WriteToUDP(resp.ToBytes(), dest); err != nil {
			s.log.Warn("dhcp: answer not sent", "to", dest, "mac", req.ClientHWAddr, "err", err)
		}
	}
}

var (
	bcastClient = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
)

// answerDHCP is the site's answer to one DHCP packet received on port (67 or 4011) from peer,
// and where to send it; nil when it does not answer.
func (s *Server) answerDHCP(req *dhcpv4.DHCPv4, port int, peer *net.UDPAddr, now time.Time) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return nil, nil
	}
	var resp *dhcpv4.DHCPv4
	switch {
	case port == pxePort:
		resp = s.answerPXEServer(req, peer, now)
	case s.cfg.DHCP.Mode == DHCPFull:
		resp = s.answerFull(req, now)
	default:
		resp = s.answerProxy(req, now)
	}
	if resp == nil {
		return nil, nil
	}
	return resp, replyDest(req, resp, port, peer)
}

// answerProxy is proxy DHCP on port 67: an offer without an address to a PXE client's
// discover; the client's requests go to the DHCP server that gives it its address (heard, not
// answered).
func (s *Server) answerProxy(req *dhcpv4.DHCPv4, now time.Time) *dhcpv4.DHCPv4 {
	if req.MessageType() == dhcpv4.MessageTypeRequest {
		a := addrFromIP(req.RequestedIPAddress())
		if !a.IsValid() {
			a = addrFromIP(req.ClientIPAddr) // renewing, or rebinding
		}
		s.hear(req.ClientHWAddr.String(), a, now)
	}
	if req.MessageType() != dhcpv4.MessageTypeDiscover {
		return nil
	}
	file, ok := s.pxeBootFile(req)
	if !ok {
		return nil
	}
	return s.reply(req, dhcpv4.MessageTypeOffer, withPXE(req, s.cfg.Address, file))
}

// answerPXEServer is port 4011: a PXE client asks the proxy for its boot file again with a
// request (or an inform), answered with an ack carrying the same boot file. It asks from the
// address it has, which proxy DHCP hears.
func (s *Server) answerPXEServer(req *dhcpv4.DHCPv4, peer *net.UDPAddr, now time.Time) *dhcpv4.DHCPv4 {
	switch req.MessageType() {
	case dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeInform:
	default:
		return nil
	}
	if ci := addrFromIP(req.ClientIPAddr); s.heard != nil && peer != nil && ci.IsValid() && ci == addrFromIP(peer.IP) {
		s.hear(req.ClientHWAddr.String(), ci, now)
	}
	file, ok := s.pxeBootFile(req)
	if !ok {
		return nil
	}
	return s.reply(req, dhcpv4.MessageTypeAck, withPXE(req, s.cfg.Address, file))
}

// answerFull is full DHCP: addresses from the lease table, and the boot file to PXE clients the
// plan boots.
func (s *Server) answerFull(req *dhcpv4.DHCPv4, now time.Time) *dhcpv4.DHCPv4 {
	mac := req.ClientHWAddr.String()
	if gw := addrFromIP(req.GatewayIPAddr); gw.IsValid() && !s.cfg.DHCP.Subnet.Contains(gw) {
		s.log.Debug("dhcp: relayed from another network: no address of ours fits it", "mac", mac, "relay", gw)
		return nil
	}
	var mods []dhcpv4.Modifier
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeInform:
		if file, ok := s.pxeBootFile(req); ok {
			mods = append(mods, withPXE(req, s.cfg.Address, file))
		}
	}
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		addr, ok := s.leases.offer(mac, addrFromIP(req.RequestedIPAddress()), now)
		if !ok {
			s.log.Warn("dhcp: no address left to offer", "mac", mac,
				"range", s.cfg.DHCP.RangeStart.String()+"-"+s.cfg.DHCP.RangeEnd.String())
			return nil
		}
		return s.reply(req, dhcpv4.MessageTypeOffer, append(mods, s.withLease(addr))...)
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(s.cfg.Address.AsSlice()) {
			s.leases.forget(mac) // it took another server's offer
			return nil
		}
		want := addrFromIP(req.RequestedIPAddress())
		if !want.IsValid() {
			want = addrFromIP(req.ClientIPAddr)
		}
		if !s.leases.request(mac, want, now) {
			s.log.Info("dhcp: nak", "mac", mac, "requested", want)
			return s.reply(req, dhcpv4.MessageTypeNak, dhcpv4.WithOption(dhcpv4.OptMessage("address not available")))
		}
		s.log.Info("dhcp: lease", "mac", mac, "addr", want, "for", s.cfg.DHCP.LeaseTime)
		s.sawLease(mac, want)
		return s.reply(req, dhcpv4.MessageTypeAck, append(mods, s.withLease(want))...)
	case dhcpv4.MessageTypeInform:
		return s.reply(req, dhcpv4.MessageTypeAck, append(mods, s.withNetwork())...)
	case dhcpv4.MessageTypeRelease:
		s.leases.release(mac, addrFromIP(req.ClientIPAddr))
	case dhcpv4.MessageTypeDecline:
		s.leases.decline(mac, addrFromIP(req.RequestedIPAddress()), now)
		s.log.Warn("dhcp: address declined (in use by something else?)", "mac", mac, "addr", req.RequestedIPAddress())
	}
	return nil
}

// hear records, in proxy mode, the address mac asked its DHCP server for.
func (s *Server) hear(mac string, a netip.Addr, now time.Time) {
	if s.heard == nil || !a.IsValid() {
		return
	}
	s.heard.heard(mac, a, now)
	s.sawLease(mac, a)
	s.log.Debug("dhcp: heard a machine ask for its address", "mac", mac, "addr", a)
}

// sawLease binds the boots of mac's machine to an address it was given or asked for, and
// unbinds any other boot from it.
func (s *Server) sawLease(mac string, a netip.Addr) {
	s.boots.sawLease(s.currentPlan().group(mac), a)
}

// leasedAddr is the address of mac's lease as the site knows it: given by the site (full DHCP)
// or heard asked for (proxy DHCP). ok is false when the site knows none, or, with DHCP off,
// cannot know.
func (s *Server) leasedAddr(mac string, now time.Time) (netip.Addr, bool) {
	switch s.cfg.DHCP.Mode {
	case DHCPFull:
		return s.leases.bound(mac, now)
	case DHCPProxy:
		return s.heard.addr(mac)
	}
	return netip.Addr{}, false
}

func (s *Server) reply(req *dhcpv4.DHCPv4, typ dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	resp, err := dhcpv4.NewReplyFromRequest(req, append([]dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(s.cfg.Address.AsSlice())),
	}, mods...)...)
	if err != nil { // only when no random transaction id could be drawn, which WithReply overwrites
		s.log.Error("dhcp: reply not built", "err", err)
		return nil
	}
	return resp
}

func (s *Server) withLease(addr netip.Addr) dhcpv4.Modifier {
	network := s.withNetwork()
	return func(d *dhcpv4.DHCPv4) {
		d.YourIPAddr = addr.AsSlice()
		network(d)
		d.UpdateOption(dhcpv4.OptIPAddressLeaseTime(s.cfg.DHCP.LeaseTime))
		d.UpdateOption(dhcpv4.OptRenewTimeValue(s.cfg.DHCP.LeaseTime / 2))
		d.UpdateOption(dhcpv4.OptRebindingTimeValue(s.cfg.DHCP.LeaseTime * 7 / 8))
	}
}

func (s *Server) withNetwork() dhcpv4.Modifier {
	c := s.cfg.DHCP
	return func(d *dhcpv4.DHCPv4) {
		d.UpdateOption(dhcpv4.OptSubnetMask(net.CIDRMask(c.Subnet.Bits(), 32)))
		d.UpdateOption(dhcpv4.OptBroadcastAddress(lastAddr(c.Subnet).AsSlice()))
		if c.Router.IsValid() {
			d.UpdateOption(dhcpv4.OptRouter(c.Router.AsSlice()))
		}
		if len(c.DNS) > 0 {
			ips := make([]net.IP, len(c.DNS))
			for i, a := range c.DNS {
				ips[i] = a.AsSlice()
			}
			d.UpdateOption(dhcpv4.OptDNS(ips...))
		}
	}
}

// PXE's vendor options (option 43): discovery control, bit 3 set: boot the file of the proxy's
// offer without discovering boot servers; a boot item the client asked for is echoed.
const (
	pxeDiscoveryControl = 6
	pxeBootItem         = 71
	pxeEnd              = 255
)

// withPXE makes an answer a PXE one: next-server and boot file, the class PXEClient, the
// vendor options and the client's machine identifier (option 97) echoed as PXE asks.
func withPXE(req *dhcpv4.DHCPv4, next netip.Addr, file string) dhcpv4.Modifier {
	return func(d *dhcpv4.DHCPv4) {
		d.ServerIPAddr = next.AsSlice()
		d.BootFileName = file
		d.UpdateOption(dhcpv4.OptClassIdentifier("PXEClient"))
		vendor := []byte{pxeDiscoveryControl, 1, 8}
		if item := pxeSubOption(req.GetOneOption(dhcpv4.OptionVendorSpecificInformation), pxeBootItem); len(item) == 4 {
			vendor = append(vendor, pxeBootItem, 4)
			vendor = append(vendor, item...)
		}
		d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, append(vendor, pxeEnd)))
		if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil {
			d.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
		}
	}
}

// pxeSubOption finds a sub-option in PXE vendor options (code, length, value …).
func pxeSubOption(opts []byte, code byte) []byte {
	for len(opts) >= 2 && opts[0] != pxeEnd {
		n := int(opts[1])
		if len(opts) < 2+n {
			return nil
		}
		if opts[0] == code {
			return opts[2 : 2+n]
		}
		opts = opts[2+n:]
	}
	return nil
}

// pxeBootFile is the boot file of a PXE client, by the plan: ok is false when the client is
// not a PXE one, the site has no plan yet, the plan ignores an unknown machine, or the site has
// no iPXE for the client's architecture.
func (s *Server) pxeBootFile(req *dhcpv4.DHCPv4) (file string, ok bool) {
	if !strings.HasPrefix(req.ClassIdentifier(), "PXEClient") {
		return "", false
	}
	mac := req.ClientHWAddr.String()
	b, ok := s.currentPlan().bootFor(mac)
	if !ok {
		s.log.Debug("dhcp: not answering PXE (no plan yet, or an unknown machine the plan ignores)", "mac", mac)
		return "", false
	}
	arch := iana.INTEL_X86PC
	if archs := req.ClientArch(); len(archs) > 0 {
		arch = archs[0]
	}
	switch {
	case isIPXE(req):
		file = s.scriptURL(mac)
	case arch == iana.INTEL_X86PC:
		file = BIOSBinary
	case arch == iana.EFI_X86_64 || arch == iana.EFI_BC:
		file = s.cfg.DHCP.EFIBinary
	default:
		s.log.Warn("dhcp: no iPXE for this client architecture", "mac", mac, "arch", arch.String())
		return "", false
	}
	machine := ""
	if b.machine != nil {
		machine = b.machine.ID
	}
	s.log.Info("dhcp: pxe", "mac", mac, "machine", machine, "arch", arch.String(), "file", file)
	return file, true
}

// isIPXE reports whether the client is iPXE already (user class "iPXE", option 77), which is
// given its script's URL rather than iPXE again.
func isIPXE(req *dhcpv4.DHCPv4) bool {
	raw := req.GetOneOption(dhcpv4.OptionUserClassInformation)
	return string(raw) == "iPXE" || slices.Contains(req.UserClass(), "iPXE")
}

// scriptURL is the URL of a machine's iPXE script (mac is aa:bb:cc:dd:ee:ff: nothing to escape).
func (s *Server) scriptURL(mac string) string {
	return s.addrs.BaseURL + "/boot/ipxe?mac=" + mac
}

// replyDest is where an answer goes (RFC 2131 4.1): through the relay that brought the request;
// back to the sender on port 4011; to the client's address when it has one; else broadcast
// (the client has no address yet, and a socket cannot write to a MAC).
func replyDest(req, resp *dhcpv4.DHCPv4, port int, peer *net.UDPAddr) *net.UDPAddr {
	if gw := req.GatewayIPAddr; gw != nil && !gw.IsUnspecified() {
		return &net.UDPAddr{IP: gw, Port: dhcpv4.ServerPort}
	}
	if port == pxePort && peer != nil && !peer.IP.IsUnspecified() {
		return peer
	}
	if ci := req.ClientIPAddr; ci != nil && !ci.IsUnspecified() && resp.MessageType() != dhcpv4.MessageTypeNak {
		return &net.UDPAddr{IP: ci, Port: dhcpv4.ClientPort}
	}
	return bcastClient
}

func addrFromIP(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}
