package pid1

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// linkPoll is how often init looks for NICs while it waits for one.
const linkPoll = 250 * time.Millisecond

// network brings up lo and the physical NICs, asks for a lease on all of them at once, and
// configures the first lease given: address, default route, resolv.conf.
func (in *Init) network(ctx context.Context) (Lease, error) {
	links, err := in.waitLinks(ctx)
	if err != nil {
		return Lease{}, err
	}
	if err := in.sys.LinkUp("lo"); err != nil {
		in.log.Warn("bcd init: cannot bring up lo", "err", err)
	}
	var up []string
	for _, l := range links {
		if err := in.sys.LinkUp(l.Name); err != nil {
			in.log.Warn("bcd init: cannot bring up a NIC", "link", l.Name, "mac", l.MAC, "err", err)
			continue
		}
		up = append(up, l.Name)
	}
	if len(up) == 0 {
		return Lease{}, errors.New("no NIC could be brought up")
	}
	if !in.sys.RandomReady() {
		// Else DHCP waits in silence: its transaction ids come from getrandom(2).
		in.log.Warn("bcd init: the kernel's random number generator is not seeded yet, and DHCP waits for it: a CPU without RDRAND, or a VM without virtio-rng (-device virtio-rng-pci and the virtio_rng module)")
	}
	// The NIC the machine PXE-booted from is asked first, alone: the site binds the ramdisk's
	// token to that NIC's lease, and another network's lease would be a race's choice.
	if nic := in.bootNIC(links, up); nic != "" {
		in.log.Info("bcd init: asking for an address by DHCP on the NIC the machine booted from", "link", nic, "for", in.cfg.DHCPTimeout)
		l, err := in.dhcpAny(ctx, []string{nic})
		if err == nil {
			if err := in.configure(l); err != nil {
				return Lease{}, err
			}
			return l, nil
		}
		if ctx.Err() != nil {
			return Lease{}, err
		}
		in.log.Warn("bcd init: no lease on the NIC the machine booted from; asking on every NIC", "err", err)
	}
	in.log.Info("bcd init: asking for an address by DHCP", "links", up, "for", in.cfg.DHCPTimeout)
	l, err := in.dhcpAny(ctx, up)
	if err != nil {
		return Lease{}, err
	}
	if err := in.configure(l); err != nil {
		return Lease{}, err
	}
	return l, nil
}

// bootNIC is the NIC of up whose MAC the kernel command line names as the one the machine
// booted from (BOOTIF=, which the site's iPXE script gives, as pxelinux does); "" for none.
func (in *Init) bootNIC(links []Link, up []string) string {
	cmdline, err := in.sys.ReadFile(cmdlinePath)
	if err != nil {
		return ""
	}
	mac, ok := siteapi.MACOfBootIF(siteapi.ParseCmdline(string(cmdline))[siteapi.CmdlineBootIF])
	if !ok {
		return ""
	}
	for _, l := range links {
		if l.MAC == mac && slices.Contains(up, l.Name) {
			return l.Name
		}
	}
	in.log.Warn("bcd init: the NIC the machine booted from is not among its NICs", "mac", mac, "links", up)
	return ""
}

// waitLinks returns the physical NICs, sorted by name, waiting up to LinkWait for one to
// appear (a driver may still be probing its device).
func (in *Init) waitLinks(ctx context.Context) ([]Link, error) {
	deadline := time.Now().Add(in.cfg.LinkWait)
	var lastErr error
	for {
		all, err := in.sys.Links()
		lastErr = err
		var phys []Link
		for _, l := range all {
			if l.Physical {
				phys = append(phys, l)
			}
		}
		if len(phys) > 0 {
			slices.SortFunc(phys, func(a, b Link) int { return strings.Compare(a.Name, b.Name) })
			return phys, nil
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return nil, fmt.Errorf("listing the network interfaces: %w", lastErr)
			}
			var names []string
			for _, l := range all {
				names = append(names, l.Name)
			}
			return nil, fmt.Errorf("no physical NIC after %v (interfaces: %v): is its driver among the ramdisk's modules (mkramdisk -modules)?", in.cfg.LinkWait, names)
		}
		if err := sleep(ctx, linkPoll); err != nil {
			return nil, err
		}
	}
}

// dhcpAny asks for a lease on every link at once and returns the first one given, stopping
// the other requests before it returns. It fails when none is given within DHCPTimeout.
func (in *Init) dhcpAny(ctx context.Context, links []string) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, in.cfg.DHCPTimeout)
	type result struct {
		link  string
		lease Lease
		err   error
	}
	results := make(chan result, len(links))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for _, name := range links {
		wg.Go(func() {
			l, err := in.sys.DHCP(ctx, name)
			results <- result{name, l, err}
		})
	}
	var failures []string
	for range links {
		r := <-results
		if r.err == nil {
			return r.lease, nil
		}
		failures = append(failures, fmt.Sprintf("%s: %v", r.link, r.err))
	}
	return Lease{}, fmt.Errorf("no DHCP lease within %v on %s (%s)", in.cfg.DHCPTimeout, strings.Join(links, ", "), strings.Join(failures, "; "))
}

// configure gives the lease's link its address and route, and writes resolv.conf.
func (in *Init) configure(l Lease) error {
	if err := in.sys.Configure(l); err != nil {
		return fmt.Errorf("configuring %s with %s: %w", l.Link, l.Address, err)
	}
	if err := in.sys.WriteFile(resolvConfPath, resolvConf(l)); err != nil {
		return fmt.Errorf("writing %s: %w", resolvConfPath, err)
	}
	in.log.Info("bcd init: network configured", "link", l.Link, "address", l.Address, "gateway", l.Gateway,
		"dns", l.DNS, "search", l.Search, "server", l.Server, "lease", l.Duration)
	return nil
}

// keepLease renews the lease from T1 on, until ctx is done. A renewal that fails is tried
// again every RetryWait; once the lease has ended, a new one is asked for on its link. The
// address stays configured meanwhile: a ramdisk that drops it mid-deploy helps no one.
func (in *Init) keepLease(ctx context.Context, l Lease) {
	for {
		at := l.renewAt()
		if at.IsZero() {
			return // it does not end
		}
		if sleep(ctx, time.Until(at)) != nil {
			return
		}
		for {
			next, err := in.renewOrRebind(ctx, l)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				if next.Address != l.Address || next.Gateway != l.Gateway || !slices.Equal(next.DNS, l.DNS) {
					if err := in.configure(next); err != nil {
						in.log.Error("bcd init: the renewed lease could not be configured", "err", err)
					}
				} else {
					in.log.Debug("bcd init: lease renewed", "link", next.Link, "address", next.Address, "lease", next.Duration)
				}
				l = next
				break
			}
			in.log.Warn("bcd init: the lease was not renewed; trying again", "link", l.Link, "err", err, "in", in.cfg.RetryWait)
			if sleep(ctx, in.cfg.RetryWait) != nil {
				return
			}
		}
	}
}

// renewOrRebind asks the lease's server to extend it while it lasts, and for a new lease on its
// link once it has ended.
func (in *Init) renewOrRebind(ctx context.Context, l Lease) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, in.cfg.DHCPTimeout)
	defer cancel()
	if time.Now().Before(l.expires()) {
		return in.sys.Renew(ctx, l)
	}
	in.log.Warn("bcd init: the lease ended; asking for a new one", "link", l.Link, "address", l.Address)
	return in.sys.DHCP(ctx, l.Link)
}
