package site

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/better-compute/compute/metal/siteapi"
)

// withDefaults returns a copy of cfg with its zero fields defaulted, or the first field that is
// wrong.
func withDefaults(cfg Config) (Config, error) {
	c := cfg
	c.DHCP.DNS = slices.Clone(cfg.DHCP.DNS)
	if c.HTTPAddr == "" && c.Address.IsValid() {
		c.HTTPAddr = netip.AddrPortFrom(c.Address, HTTPPortDefault).String()
	}
	if c.TFTPAddr == "" && c.Address.IsValid() {
		c.TFTPAddr = netip.AddrPortFrom(c.Address, TFTPPortDefault).String()
	}
	if c.StateDir == "" {
		c.StateDir = StateDirDefault
	}
	if c.IPXEDir == "" {
		c.IPXEDir = IPXEDirDefault
	}
	if c.CacheDir == "" {
		c.CacheDir = CacheDirDefault
	}
	if c.FetchConcurrency == 0 {
		c.FetchConcurrency = FetchConcurrencyDefault
	}
	if c.ReportQueue == 0 {
		c.ReportQueue = ReportQueueDefault
	}
	if c.DHCP.Mode == "" {
		c.DHCP.Mode = DHCPProxy
	}
	if c.DHCP.EFIBinary == "" {
		c.DHCP.EFIBinary = EFIBinaryDefault
	}
	if c.DHCP.Mode == DHCPFull && c.DHCP.LeaseTime == 0 {
		c.DHCP.LeaseTime = LeaseTimeDefault
	}
	if err := c.validate(); err != nil {
		return Config{}, fmt.Errorf("site: config: %w", err)
	}
	return c, nil
}

func (c *Config) validate() error {
	if !c.Address.Is4() || c.Address.IsUnspecified() || c.Address.IsMulticast() || c.Address == broadcast4 {
		return fieldErr("Address", "%v is not the site's IPv4 unicast address on the provisioning network", c.Address)
	}
	if err := c.checkListenAddr("HTTPAddr", c.HTTPAddr); err != nil {
		return err
	}
	if c.TFTPAddr != TFTPOff {
		if err := c.checkListenAddr("TFTPAddr", c.TFTPAddr); err != nil {
			return err
		}
	}
	if err := c.DHCP.validate(c.Address); err != nil {
		return err
	}
	if c.DHCP.Mode != DHCPOff && c.Interface == "" {
		return fieldErr("Interface", "the provisioning interface is required for DHCP (or set DHCP.Mode off)")
	}
	if c.TFTPAddr != TFTPOff {
		for _, name := range []string{BIOSBinary, c.DHCP.EFIBinary} {
			if err := regularFile(filepath.Join(c.IPXEDir, name)); err != nil {
				return fieldErr("IPXEDir", "%w (Debian's package ipxe installs the iPXE binaries in %s)", err, IPXEDirDefault)
			}
		}
	}
	if c.Kernel == "" || c.Initrd == "" {
		return fieldErr("Kernel, Initrd", "the ramdisk's kernel and initramfs are required")
	}
	if err := regularFile(c.Kernel); err != nil {
		return fieldErr("Kernel", "%w", err)
	}
	if err := regularFile(c.Initrd); err != nil {
		return fieldErr("Initrd", "%w", err)
	}
	if err := checkCmdline(c.Cmdline); err != nil {
		return fieldErr("Cmdline", "%w", err)
	}
	if c.FetchConcurrency < 1 || c.FetchConcurrency > 64 {
		return fieldErr("FetchConcurrency", "%d is not between 1 and 64", c.FetchConcurrency)
	}
	if c.ReportQueue < 1 {
		return fieldErr("ReportQueue", "%d is not positive", c.ReportQueue)
	}
	if c.Upstream == nil {
		return fieldErr("Upstream", "required: it is where the site's reports go")
	}
	return nil
}

var broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// checkListenAddr checks a listener's host:port: on Address, unless ListenAnywhere.
func (c *Config) checkListenAddr(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s: %q is not host:port (%v)", field, addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > math.MaxUint16 {
		return fmt.Errorf("%s: %q has no port number", field, addr)
	}
	if ip, err := netip.ParseAddr(host); !c.ListenAnywhere && (err != nil || ip.Unmap() != c.Address) {
		return fmt.Errorf("%s: %q is not on the site's Address %v: the site listens on its provisioning network only, unless ListenAnywhere is set (bcd site --listen-anywhere)", field, addr, c.Address)
	}
	return nil
}

func regularFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// checkCmdline refuses what would break the iPXE script's kernel line, or speak for the site.
func checkCmdline(s string) error {
	if len(s) > 2048 {
		return errors.New("longer than 2048 bytes")
	}
	if strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || r > unicode.MaxASCII }) {
		return errors.New("must be printable ASCII on one line")
	}
	args, _, _ := siteapi.SplitCmdline(s) // as the ramdisk's kernel will read it
	for _, a := range args {
		switch a.Name {
		case siteapi.CmdlineSite, siteapi.CmdlineMachine, siteapi.CmdlineToken, siteapi.CmdlineBootIF, "initrd":
			return fmt.Errorf("%s= is set by the site itself", a.Name)
		}
	}
	return nil
}

func (d *DHCPConfig) validate(address netip.Addr) error {
	switch d.EFIBinary {
	case EFIBinarySNP, EFIBinaryIPXE:
	default:
		return fieldErr("DHCP.EFIBinary", "%q is neither %s nor %s", d.EFIBinary, EFIBinarySNP, EFIBinaryIPXE)
	}
	switch d.Mode {
	case DHCPFull:
		return d.validateFull(address)
	case DHCPProxy, DHCPOff:
		if d.Subnet.IsValid() || d.RangeStart.IsValid() || d.RangeEnd.IsValid() || d.Router.IsValid() || len(d.DNS) > 0 || d.LeaseTime != 0 {
			return fieldErr("DHCP", "Subnet, RangeStart, RangeEnd, Router, DNS and LeaseTime are for mode %s only, not %s", DHCPFull, d.Mode)
		}
		return nil
	default:
		return fieldErr("DHCP.Mode", "%q is not %s, %s or %s", d.Mode, DHCPProxy, DHCPFull, DHCPOff)
	}
}

func (d *DHCPConfig) validateFull(address netip.Addr) error {
	if !d.Subnet.IsValid() || !d.Subnet.Addr().Is4() || d.Subnet.Bits() > 30 {
		return fieldErr("DHCP.Subnet", "%v is not an IPv4 network of at least 4 addresses (mode full needs it)", d.Subnet)
	}
	d.Subnet = d.Subnet.Masked()
	if !d.Subnet.Contains(address) {
		return fieldErr("DHCP.Subnet", "%v does not hold Address %v", d.Subnet, address)
	}
	if !d.RangeStart.Is4() || !d.Subnet.Contains(d.RangeStart) || !d.RangeEnd.Is4() || !d.Subnet.Contains(d.RangeEnd) {
		return fieldErr("DHCP.RangeStart, DHCP.RangeEnd", "%v-%v is not a range in %v", d.RangeStart, d.RangeEnd, d.Subnet)
	}
	if d.RangeEnd.Less(d.RangeStart) {
		return fieldErr("DHCP.RangeEnd", "%v is before RangeStart %v", d.RangeEnd, d.RangeStart)
	}
	if d.RangeStart == d.Subnet.Addr() || d.RangeEnd == lastAddr(d.Subnet) {
		return fieldErr("DHCP.RangeStart, DHCP.RangeEnd", "%v-%v holds the network or broadcast address of %v", d.RangeStart, d.RangeEnd, d.Subnet)
	}
	if !address.Less(d.RangeStart) && !d.RangeEnd.Less(address) {
		return fieldErr("DHCP.RangeStart, DHCP.RangeEnd", "%v-%v holds the site's own Address %v", d.RangeStart, d.RangeEnd, address)
	}
	if d.Router.IsValid() && (!d.Router.Is4() || !d.Subnet.Contains(d.Router)) {
		return fieldErr("DHCP.Router", "%v is not an address in %v", d.Router, d.Subnet)
	}
	for _, a := range d.DNS {
		if !a.Is4() {
			return fieldErr("DHCP.DNS", "%v is not an IPv4 address", a)
		}
	}
	if d.LeaseTime < time.Minute || d.LeaseTime > 365*24*time.Hour {
		return fieldErr("DHCP.LeaseTime", "%v is not between a minute and a year", d.LeaseTime)
	}
	return nil
}

// fieldErr is a config error naming the field that is wrong.
func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("%s: %w", field, fmt.Errorf(format, args...))
}

// lastAddr is the broadcast address of an IPv4 prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
