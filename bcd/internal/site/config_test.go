package site

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/metal/siteapi"
)

// TestNewValidates: each wrong field is refused by New with an error naming it.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := fixture(t, dir, newRecorder())
	base.HTTPAddr, base.TFTPAddr = "", "" // on Address, whichever a case gives
	full := DHCPConfig{Mode: DHCPFull, Subnet: netip.MustParsePrefix("192.0.2.0/24"),
		RangeStart: netip.MustParseAddr("192.0.2.100"), RangeEnd: netip.MustParseAddr("192.0.2.199")}
	cases := []struct {
		name string
		edit func(*Config)
		says string
	}{
		{"no address", func(c *Config) { c.Address = netip.Addr{} }, "Address:"},
		{"IPv6 address", func(c *Config) { c.Address = netip.MustParseAddr("2001:db8::1") }, "Address:"},
		{"broadcast address", func(c *Config) { c.Address = netip.MustParseAddr("255.255.255.255") }, "Address:"},
		{"bad HTTPAddr", func(c *Config) { c.HTTPAddr = "8067" }, "HTTPAddr:"},
		{"no address, no HTTPAddr", func(c *Config) { c.Address, c.HTTPAddr = netip.Addr{}, "" }, "Address:"},
		{"bad TFTPAddr", func(c *Config) { c.TFTPAddr = "127.0.0.1:tftp-ish" }, "TFTPAddr:"},
		// Elsewhere than the provisioning network only when told to.
		{"HTTP on every address", func(c *Config) { c.HTTPAddr = ":8067" }, "HTTPAddr: \":8067\" is not on the site's Address 127.0.0.1"},
		{"HTTP on another address", func(c *Config) { c.HTTPAddr = "127.0.0.2:8067" }, "unless ListenAnywhere"},
		{"HTTP on a name", func(c *Config) { c.HTTPAddr = "localhost:8067" }, "HTTPAddr:"},
		{"TFTP on every address", func(c *Config) { c.TFTPAddr = ":69" }, "TFTPAddr: \":69\" is not on the site's Address"},
		{"DHCP without an interface", func(c *Config) { c.DHCP = DHCPConfig{} }, "Interface:"},
		{"unknown DHCP mode", func(c *Config) { c.Interface, c.DHCP.Mode = "eth0", "relay" }, "DHCP.Mode:"},
		{"unknown EFI binary", func(c *Config) { c.DHCP.EFIBinary = "grubx64.efi" }, "DHCP.EFIBinary:"},
		{"range in proxy mode", func(c *Config) {
			c.Interface, c.DHCP = "eth0", DHCPConfig{Mode: DHCPProxy, RangeStart: netip.MustParseAddr("192.0.2.5")}
		}, "for mode full only"},
		{"full without subnet", func(c *Config) { c.Interface, c.DHCP = "eth0", DHCPConfig{Mode: DHCPFull} }, "DHCP.Subnet:"},
		{"full, address outside the subnet", func(c *Config) { c.Interface, c.DHCP = "eth0", full }, "does not hold Address"},
		{"full, range outside the subnet", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.1"), full
			c.DHCP.RangeEnd = netip.MustParseAddr("192.0.3.10")
		}, "DHCP.RangeStart, DHCP.RangeEnd:"},
		{"full, range backwards", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.1"), full
			c.DHCP.RangeStart, c.DHCP.RangeEnd = c.DHCP.RangeEnd, c.DHCP.RangeStart
		}, "DHCP.RangeEnd:"},
		{"full, range holds the site", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.150"), full
		}, "holds the site's own Address"},
		{"full, range holds broadcast", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.1"), full
			c.DHCP.RangeEnd = netip.MustParseAddr("192.0.2.255")
		}, "broadcast"},
		{"full, router elsewhere", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.1"), full
			c.DHCP.Router = netip.MustParseAddr("10.0.0.1")
		}, "DHCP.Router:"},
		{"full, lease of seconds", func(c *Config) {
			c.Interface, c.Address, c.DHCP = "eth0", netip.MustParseAddr("192.0.2.1"), full
			c.DHCP.LeaseTime = time.Second
		}, "DHCP.LeaseTime:"},
		{"no iPXE binaries", func(c *Config) { c.IPXEDir = filepath.Join(dir, "nowhere") }, "IPXEDir:"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "Kernel, Initrd:"},
		{"kernel missing", func(c *Config) { c.Kernel = filepath.Join(dir, "nope") }, "Kernel:"},
		{"initrd a directory", func(c *Config) { c.Initrd = dir }, "Initrd:"},
		{"cmdline on two lines", func(c *Config) { c.Cmdline = "quiet\nboot" }, "Cmdline:"},
		{"cmdline speaking for the site", func(c *Config) { c.Cmdline = "quiet bcd.token=x" }, "Cmdline: bcd.token="},
		{"negative concurrency", func(c *Config) { c.FetchConcurrency = -1 }, "FetchConcurrency:"},
		{"no upstream", func(c *Config) { c.Upstream = nil }, "Upstream:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			c.edit(&cfg)
			_, err := New(cfg)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("New: %v, want an error saying %q", err, c.says)
			}
		})
	}

	// Told to listen anywhere, it does.
	cfg := base
	cfg.HTTPAddr, cfg.TFTPAddr, cfg.ListenAnywhere = ":0", "0.0.0.0:0", true
	if _, err := New(cfg); err != nil {
		t.Errorf("ListenAnywhere with every address: %v", err)
	}

	// TFTP off: the iPXE binaries need not be here.
	cfg = base
	cfg.TFTPAddr, cfg.IPXEDir = TFTPOff, filepath.Join(dir, "nowhere")
	if _, err := New(cfg); err != nil {
		t.Errorf("TFTP off without iPXE binaries: %v", err)
	}
}

// TestNewDefaults: zero fields take the documented defaults, and the caller's Config is not
// changed.
func TestNewDefaults(t *testing.T) {
	t.Parallel()
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.HTTPAddr, cfg.TFTPAddr, cfg.CacheDir, cfg.StateDir = "", "", "", ""
	cfg.Interface, cfg.Address = "eth0", netip.MustParseAddr("192.0.2.1")
	cfg.DHCP = DHCPConfig{Mode: DHCPFull, Subnet: netip.MustParsePrefix("192.0.2.7/24"),
		RangeStart: netip.MustParseAddr("192.0.2.100"), RangeEnd: netip.MustParseAddr("192.0.2.199"),
		DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}}
	before := cfg
	s, err := New(cfg)
	must(t, err)
	if diff := cmp.Diff(before, cfg, cmp.Comparer(func(a, b Upstream) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("New changed the caller's config:\n%s", diff)
	}
	got := s.cfg
	if got.HTTPAddr != "192.0.2.1:8067" || got.TFTPAddr != "192.0.2.1:69" || got.CacheDir != CacheDirDefault || got.StateDir != StateDirDefault ||
		got.DHCP.EFIBinary != EFIBinaryDefault || got.DHCP.LeaseTime != LeaseTimeDefault ||
		got.FetchConcurrency != FetchConcurrencyDefault || got.ReportQueue != ReportQueueDefault ||
		got.DHCP.Subnet != netip.MustParsePrefix("192.0.2.0/24") {
		t.Errorf("defaults not applied: %+v", got)
	}
	cfg.DHCP.DNS[0] = netip.MustParseAddr("192.0.2.54")
	if s.cfg.DHCP.DNS[0] != netip.MustParseAddr("192.0.2.53") {
		t.Error("the Server shares the caller's DNS slice")
	}
}

// TestSetPlanValidates: a plan the contract refuses, or that a site cannot serve, is refused
// with the field named, and the previous plan stays.
func TestSetPlanValidates(t *testing.T) {
	t.Parallel()
	s, err := New(fixture(t, t.TempDir(), newRecorder()))
	must(t, err)
	must(t, s.SetPlan(testPlan(siteapi.UnknownInspect)))
	cases := []struct {
		name string
		edit func(*siteapi.Plan)
		says string
	}{
		{"unknown policy", func(p *siteapi.Plan) { p.Unknown = "boot-anything" }, "unknown:"},
		{"MAC twice", func(p *siteapi.Plan) { p.Machines[1].MACs = []string{macRamdisk} }, "machines[1].macs"},
		{"id twice", func(p *siteapi.Plan) { p.Machines[1].ID = "m-ramdisk" }, "machines[1].id: \"m-ramdisk\" is listed twice"},
		{"id with a space", func(p *siteapi.Plan) { p.Machines[0].ID = "m 1 bcd.token=x" }, "machines[0].id"},
		{"id with iPXE's ${", func(p *siteapi.Plan) { p.Machines[0].ID = "${root}" }, "machines[0].id"},
		{"join credential with a space", func(p *siteapi.Plan) {
			p.Machines[0].Task = &siteapi.Task{ID: "t", Kind: siteapi.TaskWipe, Then: siteapi.ThenKexec, Kernel: "http://k/", JoinCredential: "a b"}
		}, "machines[0].task.joinCredential"},
		{"bad image", func(p *siteapi.Plan) { p.Images = []siteapi.Image{{SHA256: "x", SizeBytes: 1, URL: "http://a/"}} }, "images[0].sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testPlan(siteapi.UnknownInspect)
			c.edit(&p)
			if err := s.SetPlan(p); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("SetPlan: %v, want an error saying %q", err, c.says)
			}
			if m := s.currentPlan().byMAC[macRamdisk]; m == nil || m.ID != "m-ramdisk" || m.Task.ID != "task-1" {
				t.Errorf("the previous plan did not stay: %+v", m)
			}
		})
	}

	// The site keeps its own copy: the caller's later edits do not reach it.
	p := testPlan(siteapi.UnknownInspect)
	must(t, s.SetPlan(p))
	p.Machines[0].Task.ID, p.Machines[0].MACs[0] = "changed", macUnknown
	if m := s.currentPlan().byMAC[macRamdisk]; m == nil || m.Task.ID != "task-1" {
		t.Errorf("the caller's edit reached the site's plan: %+v", m)
	}
}

// TestRunOnceAndPortInUse: Run fails at once when a port is taken, and a Server runs once.
func TestRunOnceAndPortInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer busy.Close()
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.HTTPAddr = busy.Addr().String()
	s, err := New(cfg)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "site: http:") {
		t.Errorf("Run with the HTTP port taken: %v", err)
	}
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "already called") {
		t.Errorf("second Run: %v", err)
	}
	if _, err := os.Stat(cfg.CacheDir); err != nil {
		t.Errorf("Run did not create the cache directory: %v", err)
	}
}
