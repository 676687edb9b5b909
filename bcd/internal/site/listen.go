package site

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
)

// The PXE proxy DHCP port: a PXE client asks the proxy for its boot file there (PXE 2.1).
const pxePort = 4011

// listeners are the sockets of a running Server, all bound before any is served so that a port
// in use fails Run at once.
type listeners struct {
	http net.Listener
	tftp *net.UDPConn
	dhcp []*dhcpConn
}

// dhcpConn is a DHCP socket bound to the provisioning interface.
type dhcpConn struct {
	name string // "67" or "4011"
	port int
	conn *net.UDPConn
}

func (s *Server) listen(ctx context.Context) (_ *listeners, err error) {
	l := &listeners{}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	// HTTP and TFTP listen on the provisioning interface only (unless told to listen anywhere):
	// bound to Address, a packet for it that another interface received (this host routing a
	// tenant's network to it) would still reach them.
	var lc net.ListenConfig
	if !s.cfg.ListenAnywhere && s.cfg.Interface != "" {
		lc.Control = bindToDevice(s.cfg.Interface)
	}
	if l.http, err = lc.Listen(ctx, "tcp", s.cfg.HTTPAddr); err != nil {
		return nil, fmt.Errorf("site: http: %w", err)
	}
	if s.cfg.TFTPAddr != TFTPOff {
		pc, err := lc.ListenPacket(ctx, "udp4", s.cfg.TFTPAddr)
		if err != nil {
			return nil, fmt.Errorf("site: tftp: %w", err)
		}
		l.tftp = pc.(*net.UDPConn)
	}
	if s.cfg.DHCP.Mode == DHCPOff {
		return l, nil
	}
	ports := []int{dhcpv4.ServerPort}
	if s.cfg.DHCP.Mode == DHCPProxy {
		ports = append(ports, pxePort)
	}
	for _, port := range ports {
		c, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: port})
		if err != nil {
			return nil, fmt.Errorf("site: dhcp on %s port %d: %w (bcd site needs root or CAP_NET_BIND_SERVICE and CAP_NET_RAW)", s.cfg.Interface, port, err)
		}
		l.dhcp = append(l.dhcp, &dhcpConn{name: fmt.Sprint(port), port: port, conn: c})
	}
	return l, nil
}

func (l *listeners) close() {
	if l.http != nil {
		l.http.Close()
	}
	if l.tftp != nil {
		l.tftp.Close()
	}
	for _, d := range l.dhcp {
		d.conn.Close()
	}
}

func (l *listeners) addrs(address netip.Addr) Addrs {
	a := Addrs{HTTP: l.http.Addr().(*net.TCPAddr).AddrPort()}
	if l.tftp != nil {
		a.TFTP = l.tftp.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	a.BaseURL = "http://" + netip.AddrPortFrom(address, a.HTTP.Port()).String()
	return a
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
