package app

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/daemon"
	"github.com/better-compute/compute/bcd/internal/site"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/metal/siteagent"
)

func siteCmd(s *settings) *cobra.Command {
	var cfg site.Config
	var address, subnet, dhcpRange, router string
	var dns, fetchAllow []string
	c := &cobra.Command{
		Use:   "site --interface IF --address IP --kernel FILE --initrd FILE",
		Short: "Run a site agent: PXE, iPXE, the image cache and BMC access for the machines of a site",
		Long: `site runs the site agent of a datacenter (docs/site.md): it joins like a node, with a site token
(bcd join --token <a join token of role site>), holds a session with a gateway, and serves the
site's machines on their provisioning network as the control plane's plan says: proxy DHCP (or
full DHCP in a small lab), TFTP for iPXE, an iPXE script per machine, the ramdisk's kernel and
initramfs, the ramdisk's API and the image cache. It carries out the control plane's BMC
operations (IPMI, Redfish), whose passwords reach it sealed in its commands.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Address, err = netip.ParseAddr(address); err != nil {
				return usageError{Err: fmt.Errorf("--address: %w", err)}
			}
			if err := dhcpFlags(&cfg.DHCP, subnet, dhcpRange, router, dns); err != nil {
				return usageError{Err: err}
			}
			if cfg.FetchAllow, err = parseRanges("--fetch-allow", fetchAllow); err != nil {
				return usageError{Err: err}
			}
			cfg.StateDir = filepath.Join(s.StateDir, "site")
			reports := nodeagent.NewReports()
			log := s.logger(cmd.ErrOrStderr())
			cfg.Upstream, cfg.Logger = upstream{reports}, log.With("part", "site")
			srv, err := site.New(cfg)
			if err != nil {
				return err
			}
			ctx, cancel := signals()
			defer cancel()
			ctx, stop := context.WithCancel(ctx)
			defer stop()
			// The services and the session run together; either ending ends the other.
			var wg sync.WaitGroup
			var siteErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer stop()
				siteErr = srv.Run(ctx)
			}()
			err = daemon.Run(ctx, daemon.Config{StateDir: s.StateDir, Gateway: s.Gateway, Transport: s.Transport, Fake: &daemon.Fake{}, Version: version, Logger: log,
				Extensions: append(s.exts, siteagent.Extension(srv, siteagent.Options{})), Reports: reports})
			stop()
			wg.Wait()
			return errors.Join(err, siteErr)
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Interface, "interface", "", "the provisioning network's interface, where DHCP is answered")
	f.StringVar(&address, "address", "", "the site's IPv4 address on that interface: the host of every URL it hands out")
	f.StringVar(&cfg.HTTPAddr, "http", "", fmt.Sprintf("where the iPXE scripts, the ramdisk's files and API and the image cache are served (default ADDRESS:%d)", site.HTTPPortDefault))
	f.StringVar(&cfg.TFTPAddr, "tftp", "", fmt.Sprintf(`where TFTP serves the iPXE binaries (default ADDRESS:%d); "off" for none`, site.TFTPPortDefault))
	f.BoolVar(&cfg.ListenAnywhere, "listen-anywhere", false, "let --http and --tftp listen elsewhere than ADDRESS on the provisioning interface (by default they are bound to both, and no other network reaches them)")
	f.StringVar(&cfg.DHCP.Mode, "dhcp", site.DHCPProxy, "proxy (another server gives addresses), full (this one does: --dhcp-subnet, --dhcp-range) or off")
	f.StringVar(&subnet, "dhcp-subnet", "", "full DHCP: the provisioning network, e.g. 192.0.2.0/24")
	f.StringVar(&dhcpRange, "dhcp-range", "", "full DHCP: the addresses given out, FIRST-LAST")
	f.StringVar(&router, "dhcp-router", "", "full DHCP: the default gateway given out")
	f.StringSliceVar(&dns, "dhcp-dns", nil, "full DHCP: DNS servers given out")
	f.StringVar(&cfg.IPXEDir, "ipxe-dir", site.IPXEDirDefault, "the iPXE binaries (Debian package ipxe)")
	f.StringVar(&cfg.Kernel, "kernel", "", "the ramdisk's kernel")
	f.StringVar(&cfg.Initrd, "initrd", "", "the ramdisk's initramfs, holding bcd (go run ./internal/tools/cmd/mkramdisk)")
	f.StringVar(&cfg.Cmdline, "ramdisk-cmdline", "", "added to the ramdisk's kernel command line, e.g. console=ttyS0,115200")
	f.StringVar(&cfg.CacheDir, "cache-dir", site.CacheDirDefault, "the image cache, which bcd site owns")
	f.StringSliceVar(&fetchAllow, "fetch-allow", nil, "ranges (CIDR, repeated or comma-separated) beyond public addresses that images may be fetched from, e.g. a local mirror's; images' URLs are tenants' choices, refused elsewhere as the control plane refuses them (docs/security.md)")
	f.StringVar(&s.Gateway, "gateway", "", "gateway address host:port (default: what the join gave)")
	transportFlag(c, s)
	return c
}

func dhcpFlags(d *site.DHCPConfig, subnet, dhcpRange, router string, dns []string) error {
	var err error
	if subnet != "" {
		if d.Subnet, err = netip.ParsePrefix(subnet); err != nil {
			return fmt.Errorf("--dhcp-subnet: %w", err)
		}
	}
	if dhcpRange != "" {
		first, last, ok := strings.Cut(dhcpRange, "-")
		if !ok {
			return errors.New("--dhcp-range: FIRST-LAST, e.g. 192.0.2.100-192.0.2.199")
		}
		if d.RangeStart, err = netip.ParseAddr(first); err != nil {
			return fmt.Errorf("--dhcp-range: %w", err)
		}
		if d.RangeEnd, err = netip.ParseAddr(last); err != nil {
			return fmt.Errorf("--dhcp-range: %w", err)
		}
	}
	if router != "" {
		if d.Router, err = netip.ParseAddr(router); err != nil {
			return fmt.Errorf("--dhcp-router: %w", err)
		}
	}
	for _, a := range dns {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("--dhcp-dns: %w", err)
		}
		d.DNS = append(d.DNS, ip)
	}
	return nil
}

// upstream sends the site's reports up the session: it returns once the control plane recorded
// one, and marks one it refused as rejected, which the site does not retry.
type upstream struct{ r *nodeagent.Reports }

func (u upstream) Report(ctx context.Context, kind string, payload any) error {
	err := u.r.Report(ctx, kind, payload)
	if refused := (*nodeagent.RefusedError)(nil); errors.As(err, &refused) {
		return fmt.Errorf("%w: %w", site.ErrRejected, err)
	}
	return err
}
