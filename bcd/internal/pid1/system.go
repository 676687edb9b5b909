package pid1

import (
	"context"
	"io"
	"net/netip"
	"time"
)

// System is what init does to the machine, one small call each, so that its logic runs in
// tests against a fake: Linux() is the machine's.
type System interface {
	// Mount mounts a filesystem, making its mount point; one already mounted there is not an
	// error.
	Mount(m Mount) error
	// OpenConsole opens /dev/console for writing.
	OpenConsole() (io.WriteCloser, error)
	// ReadFile and WriteFile read and replace a file.
	ReadFile(name string) ([]byte, error)
	WriteFile(name string, data []byte) error
	// LoadModule loads the kernel module in a .ko file (finit_module(2)); one already loaded
	// is not an error.
	LoadModule(path string) error
	// Links are the machine's network interfaces.
	Links() ([]Link, error)
	// LinkUp sets an interface administratively up.
	LinkUp(name string) error
	// DHCP asks for a lease on an interface until one is given or ctx is done.
	DHCP(ctx context.Context, link string) (Lease, error)
	// Renew asks the lease's server to extend it.
	Renew(ctx context.Context, l Lease) (Lease, error)
	// Configure gives the lease's interface its address (and no other IPv4 address) and the
	// default route through its gateway.
	Configure(l Lease) error
	// RandomReady says whether the kernel's random number generator is seeded: until it is,
	// getrandom(2) blocks, and with it the DHCP client's transaction ids and TLS.
	RandomReady() bool
	// Reap collects the exit status of every child that has exited, and says how many.
	Reap() int
}

// Mount is a filesystem to mount.
type Mount struct {
	Source, Target, FSType string
	// NoSuid, NoDev and NoExec are MS_NOSUID, MS_NODEV and MS_NOEXEC.
	NoSuid, NoDev, NoExec bool
	Data                  string // options: "mode=1777"
}

// Link is a network interface.
type Link struct {
	Name string
	MAC  string // lowercase; empty for one without (lo)
	// Physical is an interface with a device behind it (/sys/class/net/<name>/device): a NIC,
	// not lo, a bridge, a bond or a tunnel.
	Physical bool
}

// Lease is an IPv4 address given by DHCP, with what came with it.
type Lease struct {
	Link    string
	Address netip.Prefix // the address and the subnet's length: 10.0.2.15/24
	Gateway netip.Addr   // the default router; invalid when the lease names none
	DNS     []netip.Addr
	Search  []string   // the domain name and the search list
	Server  netip.Addr // the DHCP server that gave it
	// Acquired is when the server acknowledged it; Duration is how long it lasts from then
	// (0: for ever) and RenewAfter when to ask to extend it (T1).
	Acquired   time.Time
	Duration   time.Duration
	RenewAfter time.Duration
	raw        any // the System's own record of the lease, for Renew
}

// expires is when the lease ends; the zero time for one that does not.
func (l Lease) expires() time.Time {
	if l.Duration <= 0 {
		return time.Time{}
	}
	return l.Acquired.Add(l.Duration)
}

// renewAt is when to ask to extend the lease: RenewAfter, else half its duration (RFC 2131's
// T1); the zero time for one that does not end.
func (l Lease) renewAt() time.Time {
	switch {
	case l.Duration <= 0:
		return time.Time{}
	case l.RenewAfter > 0 && l.RenewAfter < l.Duration:
		return l.Acquired.Add(l.RenewAfter)
	}
	return l.Acquired.Add(l.Duration / 2)
}
