//go:build linux

package pid1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dhcpResend is how long the DHCP client waits for an answer before it sends again.
const dhcpResend = 4 * time.Second

// Linux is the machine's System: mount(2), finit_module(2), netlink, a DHCP client on a raw
// socket (nclient4) and wait4(2).
func Linux() System { return linuxSystem{} }

type linuxSystem struct{}

func (linuxSystem) Mount(m Mount) error {
	if err := os.MkdirAll(m.Target, 0o755); err != nil {
		return err
	}
	var flags uintptr
	if m.NoSuid {
		flags |= unix.MS_NOSUID
	}
	if m.NoDev {
		flags |= unix.MS_NODEV
	}
	if m.NoExec {
		flags |= unix.MS_NOEXEC
	}
	err := unix.Mount(m.Source, m.Target, m.FSType, flags, m.Data)
	if errors.Is(err, unix.EBUSY) {
		return nil // mounted already
	}
	return err
}

func (linuxSystem) OpenConsole() (io.WriteCloser, error) {
	return os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0)
}

func (linuxSystem) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// WriteFile replaces name through a temporary file and a rename, so that a reader never sees
// half of it.
func (linuxSystem) WriteFile(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

func (linuxSystem) LoadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if errors.Is(err, unix.EEXIST) {
		return nil // loaded already
	}
	if err != nil {
		return fmt.Errorf("finit_module %s: %w", path, err)
	}
	return nil
}

func (linuxSystem) Links() ([]Link, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var links []Link
	for _, l := range all {
		a := l.Attrs()
		_, err := os.Stat(filepath.Join("/sys/class/net", a.Name, "device"))
		links = append(links, Link{Name: a.Name, MAC: strings.ToLower(a.HardwareAddr.String()), Physical: err == nil})
	}
	return links, nil
}

func (linuxSystem) LinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// DHCP runs DISCOVER, OFFER, REQUEST, ACK on a raw socket of the link (it has no address
// yet), sending again every dhcpResend until ctx is done. The socket is closed before it
// returns: left open, it would copy every IP packet the machine receives, an image's included.
func (linuxSystem) DHCP(ctx context.Context, link string) (Lease, error) {
	c, err := nclient4.New(link, nclient4.WithTimeout(dhcpResend), nclient4.WithRetry(1<<20))
	if err != nil {
		return Lease{}, err
	}
	defer c.Close()
	nl, err := c.Request(ctx)
	if err != nil {
		return Lease{}, err
	}
	l, err := leaseFromACK(nl.ACK, link, nl.CreationTime)
	l.raw = nl
	return l, err
}

func (linuxSystem) Renew(ctx context.Context, l Lease) (Lease, error) {
	old, ok := l.raw.(*nclient4.Lease)
	if !ok {
		return Lease{}, errors.New("the lease was not given by this system's DHCP client")
	}
	c, err := nclient4.New(l.Link, nclient4.WithTimeout(dhcpResend), nclient4.WithRetry(1<<20))
	if err != nil {
		return Lease{}, err
	}
	defer c.Close()
	nl, err := c.Renew(ctx, old)
	if err != nil {
		return Lease{}, err
	}
	next, err := leaseFromACK(nl.ACK, l.Link, nl.CreationTime)
	next.raw = nl
	return next, err
}

func (linuxSystem) Configure(l Lease) error {
	link, err := netlink.LinkByName(l.Link)
	if err != nil {
		return err
	}
	want := &netlink.Addr{IPNet: prefixNet(l.Address)}
	if err := netlink.AddrReplace(link, want); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if !a.IPNet.IP.Equal(want.IP) { // a former lease's
			if err := netlink.AddrDel(link, &a); err != nil {
				return fmt.Errorf("removing %s: %w", a.IPNet, err)
			}
		}
	}
	if !l.Gateway.IsValid() {
		return nil
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: l.Gateway.AsSlice(), Dst: prefixNet(netip.MustParsePrefix("0.0.0.0/0"))}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("default route through %s: %w", l.Gateway, err)
	}
	return nil
}

// RandomReady asks getrandom(2) without blocking: EAGAIN means the kernel's generator is not
// seeded yet.
func (linuxSystem) RandomReady() bool {
	var b [1]byte
	_, err := unix.Getrandom(b[:], unix.GRND_NONBLOCK)
	return !errors.Is(err, unix.EAGAIN)
}

func (linuxSystem) Reap() int {
	n := 0
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return n
		}
		n++
	}
}

// notifyChildExit is a channel that receives SIGCHLD.
func notifyChildExit() chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, unix.SIGCHLD)
	return c
}

func stopNotify(c chan os.Signal) { signal.Stop(c) }
