package app

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/internal/nodeagent"
	"github.com/better-compute/compute/vps/hostagent"
	"github.com/better-compute/compute/vps/runtime/libvirt"
)

// vmHostFlags make bcd node a VM host of the vps module (docs/vps.md).
type vmHostFlags struct {
	runtime    string // libvirt, or empty: not a VM host
	dir        string
	socket     string
	uri        string
	domainType string
	fileOwner  string
}

func (f *vmHostFlags) flags(c *cobra.Command) {
	c.Flags().StringVar(&f.runtime, "vps-runtime", "", "run the vps module's instances with this runtime: libvirt (libvirt-kvm); empty: not a VM host")
	c.Flags().StringVar(&f.dir, "vps-dir", "", "where the VM host keeps images, consoles and instances' disks (default <state-dir>/vps)")
	c.Flags().StringVar(&f.socket, "libvirt-socket", "/run/libvirt/libvirt-sock", "libvirtd's (or virtqemud's) Unix socket")
	c.Flags().StringVar(&f.uri, "libvirt-uri", "qemu:///system", "the libvirt driver: qemu:///system, or qemu:///session for a per-user daemon")
	c.Flags().StringVar(&f.domainType, "libvirt-domain-type", "kvm", "kvm, or qemu on a host without /dev/kvm (TCG: slow)")
	c.Flags().StringVar(&f.fileOwner, "libvirt-file-owner", "", "uid:gid that owns the disks and states the runtime makes (a session-mode libvirtd's user); empty: libvirtd's own")
}

// start makes the runtime and the host agent, and runs the agent's reports until ctx ends or
// stop is called.
func (f *vmHostFlags) start(ctx context.Context, s *settings, reports *nodeagent.Reports, logger *slog.Logger) (ext.Extension, func(), error) {
	if f.runtime != "libvirt" {
		return ext.Extension{}, nil, fmt.Errorf("--vps-runtime %q: the runtime here is libvirt (cloud-hypervisor's is not wired into bcd yet)", f.runtime)
	}
	dir := f.dir
	if dir == "" {
		dir = filepath.Join(s.StateDir, "vps")
	}
	rt, err := libvirt.New(libvirt.Options{Socket: f.socket, URI: f.uri, DomainType: f.domainType,
		StateDir: filepath.Join(dir, "instances"), FileOwner: f.fileOwner})
	if err != nil {
		return ext.Extension{}, nil, err
	}
	a, err := hostagent.New(hostagent.Options{Runtime: rt, Dir: dir, Reporter: reports, Logger: logger})
	if err != nil {
		_ = rt.Close()
		return ext.Extension{}, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	return a.Extension(), func() { cancel(); <-done; _ = rt.Close() }, nil
}
