package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/hostagent"
	"github.com/better-compute/compute/vps/hostnet"
	"github.com/better-compute/compute/vps/runtime"
	"github.com/better-compute/compute/vps/runtime/chv"
	"github.com/better-compute/compute/vps/runtime/libvirt"
)

// vmHostFlags make bcd node a VM host of the vps module (docs/vps.md).
type vmHostFlags struct {
	runtime     string // libvirt, chv, or empty: not a VM host
	dir         string
	socket      string
	uri         string
	domainType  string
	fileOwner   string
	chvBinary   string
	chvFirmware string
	uplink      string
	fetchAllow  []string // CIDRs the host may fetch tenants' images from beyond public addresses
	imageMaxGiB int
	machine     atomic.Value // nodeagent.Hardware, once bcd node has opened it
}

// sawHardware keeps the machine bcd node opened, for its GPUs' PCI addresses.
func (f *vmHostFlags) sawHardware(hw nodeagent.Hardware) { f.machine.Store(&hw) }

// gpus reads the machine's GPUs: UUID → PCI address.
func (f *vmHostFlags) gpus(ctx context.Context) (map[string]string, error) {
	hw, _ := f.machine.Load().(*nodeagent.Hardware)
	if hw == nil {
		return nil, errors.New("bcd node has not opened the machine yet")
	}
	inv, err := (*hw).Inventory(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range inv.GetGpus() {
		out[g.GetUuid()] = g.GetPciAddress()
	}
	return out, nil
}

// imageClient is the client that fetches tenants' image URLs: a tenant chose them, so the host
// connects only where the control plane's outbound policy would (netpolicy), plus the ranges
// of --vps-fetch-allow.
func (f *vmHostFlags) imageClient() (*http.Client, error) {
	allow, err := parseRanges("--vps-fetch-allow", f.fetchAllow)
	if err != nil {
		return nil, err
	}
	policy, err := netpolicy.New(allow)
	if err != nil {
		return nil, fmt.Errorf("--vps-fetch-allow: %w", err)
	}
	return policy.Client(10 * time.Minute), nil
}

// parseRanges reads a flag's CIDR ranges.
func parseRanges(flag string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s %q: want a range such as 10.1.0.0/16: %w", flag, s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func (f *vmHostFlags) flags(c *cobra.Command) {
	c.Flags().StringVar(&f.runtime, "vps-runtime", "", "run the vps module's instances with this runtime: libvirt (libvirt-kvm) or chv (cloud-hypervisor); empty: not a VM host")
	c.Flags().StringVar(&f.uplink, "vps-uplink", "", "the host's interface that carries the vps networks' VLANs (eth0, bond0); bridges are made (as root) for instances' NICs")
	c.Flags().StringVar(&f.dir, "vps-dir", "", "where the VM host keeps images, consoles and instances' disks (default <state-dir>/vps)")
	c.Flags().StringVar(&f.socket, "libvirt-socket", "/run/libvirt/libvirt-sock", "libvirtd's (or virtqemud's) Unix socket")
	c.Flags().StringVar(&f.uri, "libvirt-uri", "qemu:///system", "the libvirt driver: qemu:///system, or qemu:///session for a per-user daemon")
	c.Flags().StringVar(&f.domainType, "libvirt-domain-type", "kvm", "kvm, or qemu on a host without /dev/kvm (TCG: slow)")
	c.Flags().StringVar(&f.fileOwner, "libvirt-file-owner", "", "uid:gid that owns the disks and states the runtime makes (a session-mode libvirtd's user); empty: libvirtd's own")
	c.Flags().StringVar(&f.chvBinary, "chv-binary", chv.DefaultBinary, "the cloud-hypervisor executable (--vps-runtime chv), a path or a name on PATH")
	c.Flags().IntVar(&f.imageMaxGiB, "vps-image-max-gib", hostagent.DefaultMaxImageBytes>>30, "the largest image (kernel, initramfs or disk) fetched for a tenant, in GiB: a URL could serve bytes without end")
	c.Flags().StringSliceVar(&f.fetchAllow, "vps-fetch-allow", nil, "ranges (CIDR, repeated or comma-separated) beyond public addresses that tenants' image URLs may be fetched from, e.g. a local mirror's; the rest are refused, as the control plane refuses them (docs/security.md)")
	c.Flags().StringVar(&f.chvFirmware, "chv-firmware", "", "the firmware (e.g. CLOUDHV.fd) that boots instances with a disk and no kernel (--vps-runtime chv); empty: such instances are refused")
}

// start makes the runtime and the host agent, and runs the agent's reports until ctx ends or
// stop is called.
func (f *vmHostFlags) start(ctx context.Context, s *settings, reports *nodeagent.Reports, logger *slog.Logger) (ext.Extension, func(), error) {
	dir := f.dir
	if dir == "" {
		dir = filepath.Join(s.StateDir, "vps")
	}
	var rt runtime.Runtime
	closeRT := func() {}
	switch f.runtime {
	case "libvirt":
		lv, err := libvirt.New(libvirt.Options{Socket: f.socket, URI: f.uri, DomainType: f.domainType,
			StateDir: filepath.Join(dir, "instances"), FileOwner: f.fileOwner})
		if err != nil {
			return ext.Extension{}, nil, err
		}
		rt, closeRT = lv, func() { _ = lv.Close() }
	case "chv":
		// Its VMMs outlive bcd (a restarted bcd finds them by their sockets): nothing to close.
		ch, err := chv.New(chv.Options{Binary: f.chvBinary, Firmware: f.chvFirmware, StateDir: filepath.Join(dir, "cloud-hypervisor")})
		if err != nil {
			return ext.Extension{}, nil, fmt.Errorf("--vps-runtime chv: %w", err)
		}
		rt = ch
	default:
		return ext.Extension{}, nil, fmt.Errorf("--vps-runtime %q: want libvirt (libvirt-kvm) or chv (cloud-hypervisor)", f.runtime)
	}
	images, err := f.imageClient()
	if err != nil {
		closeRT()
		return ext.Extension{}, nil, err
	}
	opts := hostagent.Options{Runtime: rt, Dir: dir, Reporter: reports, Logger: logger, Uplink: f.uplink, GPUs: f.gpus, HTTP: images,
		MaxImageBytes: int64(f.imageMaxGiB) << 30}
	if os.Geteuid() == 0 { // bridges and VLAN sub-interfaces are made as root; otherwise NICs plug into those that exist
		links, err := hostnet.New()
		if err != nil {
			closeRT()
			return ext.Extension{}, nil, err
		}
		opts.Links = links
	}
	a, err := hostagent.New(opts)
	if err != nil {
		closeRT()
		return ext.Extension{}, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	return a.Extension(), func() { cancel(); <-done; closeRT() }, nil
}
