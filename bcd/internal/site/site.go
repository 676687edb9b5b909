// Package site is what `bcd site` serves on a datacenter's provisioning network: DHCP (proxy
// DHCP by default, full DHCP for a small lab) that chainloads iPXE, TFTP for the iPXE binaries,
// and HTTP for the iPXE scripts, the ramdisk's kernel and initramfs, the ramdisk's API and the
// site's image cache. What it answers is decided by the plan (siteapi.Plan) the control plane
// sends; what it learns (a ramdisk's hello, a task's progress, an image cached) goes up through
// an Upstream.
//
// A Server is built by New, which validates its Config and starts nothing; SetPlan replaces its
// plan at any time; Run serves until its context ends and returns once every goroutine it
// started has stopped. docs/site.md describes the protocols and the trust model.
package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/netpolicy"
)

// Upstream is where the site's reports go: the site agent's session with the control plane.
// kind is one of siteapi.KindMachineSeen (payload siteapi.MachineSeen), siteapi.KindTaskProgress
// (siteapi.Progress) and siteapi.KindImageCached (siteapi.ImageState). Report is called from one
// goroutine at a time, in the order the reports were made; an error means the report was not
// delivered and it is tried again with backoff, unless the error wraps ErrRejected. Report must
// return once ctx ends: Run waits for it.
type Upstream interface {
	Report(ctx context.Context, kind string, payload any) error
}

// ErrRejected is what an Upstream wraps when the control plane refused a report for good (it
// was invalid): the report is logged at error level and not tried again.
var ErrRejected = errors.New("site: report rejected by the control plane")

// The DHCP modes.
const (
	DHCPProxy = "proxy" // answer PXE clients only; another DHCP server gives addresses (default)
	DHCPFull  = "full"  // give addresses too, from DHCPConfig's range (a small lab)
	DHCPOff   = "off"   // no DHCP at all: machines are pointed at the site some other way
)

// The iPXE binaries the site hands to firmware PXE clients, served over TFTP from IPXEDir.
const (
	BIOSBinary    = "undionly.kpxe" // legacy BIOS (client architecture 0): iPXE over the NIC's UNDI
	EFIBinaryIPXE = "ipxe.efi"      // UEFI, iPXE with its own NIC drivers
	EFIBinarySNP  = "snponly.efi"   // UEFI, iPXE over the firmware's network protocol (SNP)
)

// Defaults of Config's zero fields.
const (
	HTTPPortDefault         = 8067            // HTTPAddr is Address:8067
	TFTPPortDefault         = 69              // TFTPAddr is Address:69
	IPXEDirDefault          = "/usr/lib/ipxe" // Debian's package ipxe
	CacheDirDefault         = "/var/cache/bcd/site/images"
	StateDirDefault         = "/var/lib/bcd/site"
	EFIBinaryDefault        = EFIBinarySNP
	LeaseTimeDefault        = time.Hour
	FetchConcurrencyDefault = 2
	ReportQueueDefault      = 1024
)

// TFTPOff as Config.TFTPAddr turns the site's TFTP server off (firmware is still told to fetch
// the iPXE binaries from Address: something else serves them there).
const TFTPOff = "off"

// Config is a site's configuration. Zero fields take the documented defaults; New copies it.
type Config struct {
	// Interface is the provisioning interface: DHCP binds to it. Required unless DHCP is off.
	Interface string
	// Address is the site's IPv4 address on Interface: the next-server it gives PXE clients and
	// the host of every URL it hands out. Required.
	Address netip.Addr
	// HTTPAddr is where HTTP listens (default Address:HTTPPortDefault); its port is the port of
	// the base URL http://Address:port. Port 0 picks a free port (tests): Addrs reports it.
	HTTPAddr string
	// TFTPAddr is where TFTP listens (default Address:TFTPPortDefault); TFTPOff turns it off.
	TFTPAddr string
	// ListenAnywhere lets HTTPAddr and TFTPAddr name another address than Address, or none
	// (":8067": every address). Without it both listen on Address only, and on Interface only
	// when there is one (SO_BINDTODEVICE), so that no other network reaches them, even through
	// this host's routes.
	ListenAnywhere bool
	DHCP           DHCPConfig
	// IPXEDir holds the iPXE binaries (default IPXEDirDefault): BIOSBinary and DHCP.EFIBinary
	// must be there while TFTP is on.
	IPXEDir string
	// Kernel and Initrd are the ramdisk's kernel and initramfs (holding bcd ramdisk), served at
	// /boot/vmlinuz and /boot/initrd. Required.
	Kernel, Initrd string
	// Cmdline is added to the ramdisk's kernel command line (console=ttyS0,115200 …).
	Cmdline string
	// CacheDir is the image cache (default CacheDirDefault), created by Run. bcd site owns it:
	// files in it that no plan names are removed.
	CacheDir string
	// StateDir is where the site keeps, across restarts, the boots of its machines' ramdisks
	// (their tokens' SHA-256, MACs and addresses) and the join credentials it has handed over
	// (default StateDirDefault), created by Run.
	StateDir string
	// FetchConcurrency bounds the images downloaded at once (default FetchConcurrencyDefault).
	FetchConcurrency int
	// FetchAllow are the ranges beyond public addresses that images may be fetched from (a
	// local mirror's). An image's URL is a tenant's choice, so the site connects only where
	// the control plane's outbound policy would (netpolicy): none by default.
	FetchAllow []netip.Prefix
	// ReportQueue bounds the reports waiting for Upstream (default ReportQueueDefault). While it
	// is full, ramdisks are answered 503 and retry.
	ReportQueue int
	// Upstream receives the reports. Required.
	Upstream Upstream
	// Logger is where the site logs; nil discards.
	Logger *slog.Logger
}

// DHCPConfig is how the site answers DHCP.
type DHCPConfig struct {
	// Mode is DHCPProxy (default), DHCPFull or DHCPOff.
	Mode string
	// EFIBinary is what UEFI firmware (architectures 7 and 9) is given: EFIBinarySNP (default)
	// or EFIBinaryIPXE.
	EFIBinary string

	// The rest is for DHCPFull only, and refused in the other modes.

	// Subnet is the provisioning network (192.0.2.0/24): it must hold Address and the range.
	Subnet netip.Prefix
	// RangeStart and RangeEnd bound the addresses given out (inclusive); Address is not among them.
	RangeStart, RangeEnd netip.Addr
	// Router is the default gateway given out; zero gives none.
	Router netip.Addr
	// DNS servers given out; none by default.
	DNS []netip.Addr
	// LeaseTime is how long an address is given for (default LeaseTimeDefault).
	LeaseTime time.Duration
}

// Addrs are the addresses a running Server listens on.
type Addrs struct {
	HTTP    netip.AddrPort // the HTTP listener
	TFTP    netip.AddrPort // the TFTP listener; zero when TFTP is off
	BaseURL string         // http://Address:port, as handed out in scripts and DHCP answers
}

// Server is a site agent's local services. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	reports *reporter
	cache   *cache
	// progressWait bounds how long a progress post waits for the control plane (progressWait;
	// tests shorten it).
	progressWait time.Duration

	mu   sync.RWMutex
	plan *planIndex // nil until the first SetPlan

	leases *leaseTable // DHCPFull only
	heard  *heardTable // DHCPProxy only: the addresses the machines asked their DHCP server for
	boots  *bootTable

	running atomic.Bool
	ready   chan struct{}
	addrs   Addrs // written once by Run before ready is closed
}

// New validates cfg and returns a Server that serves nothing until Run.
func New(cfg Config) (*Server, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "site")
	s := &Server{cfg: c, log: log, ready: make(chan struct{}), progressWait: progressWait}
	s.reports = newReporter(c.Upstream, c.ReportQueue, log)
	policy, err := netpolicy.New(c.FetchAllow)
	if err != nil {
		return nil, fmt.Errorf("site: FetchAllow: %w", err)
	}
	s.cache = newCache(c.CacheDir, c.FetchConcurrency, policy, s.reports, log)
	if c.DHCP.Mode == DHCPFull {
		s.leases = newLeaseTable(c.DHCP.RangeStart, c.DHCP.RangeEnd, c.DHCP.LeaseTime)
	}
	if c.DHCP.Mode == DHCPProxy {
		s.heard = newHeardTable()
	}
	s.boots = newBootTable(log)
	return s, nil
}

// SetPlan replaces the site's plan with p once it is valid (siteapi.Plan.Validate, plus what a
// site needs: unique machine ids, ids and tokens that can stand on a kernel command line). The
// image cache then fetches the images p adds and removes those it dropped.
func (s *Server) SetPlan(p siteapi.Plan) error {
	idx, err := indexPlan(p)
	if err != nil {
		return fmt.Errorf("site: plan: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock() // held across all, so that concurrent calls leave one plan everywhere
	s.plan = idx
	s.cache.want(idx.images)
	s.boots.keepClaims(idx.tasks)
	s.log.Info("plan", "site", p.Site, "machines", len(p.Machines), "images", len(idx.images), "unknown", p.Unknown)
	return nil
}

func (s *Server) currentPlan() *planIndex {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.plan
}

// Ready is closed once Run has bound every socket; Addrs is valid from then on.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addrs reports where Run listens: zero before Ready is closed.
func (s *Server) Addrs() Addrs {
	select {
	case <-s.ready:
		return s.addrs
	default:
		return Addrs{}
	}
}

// shutdownGrace bounds how long Run waits for HTTP requests in flight (an image being
// streamed) once its context has ended, before it cuts them.
const shutdownGrace = 5 * time.Second

// Run serves DHCP, TFTP and HTTP, and keeps the image cache, until ctx ends; it returns nil
// then, or the error of a service that failed (the others are stopped). Every goroutine it
// started has stopped when it returns. A Server runs once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("site: Run was already called on this Server")
	}
	if err := s.cache.prepare(); err != nil {
		return err
	}
	if err := s.boots.load(s.cfg.StateDir); err != nil {
		return err
	}
	l, err := s.listen(ctx)
	if err != nil {
		return err
	}
	s.addrs = l.addrs(s.cfg.Address)
	close(s.ready)
	s.log.Info("serving", "http", s.addrs.HTTP, "tftp", s.addrs.TFTP, "dhcp", s.cfg.DHCP.Mode,
		"interface", s.cfg.Interface, "base_url", s.addrs.BaseURL)

	svcCtx, stop := context.WithCancel(ctx)
	defer stop()
	// The reporter outlives the services, so that what they reported while stopping is sent.
	repCtx, stopReports := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReports()
	var reportsDone sync.WaitGroup
	reportsDone.Go(func() { s.reports.run(repCtx) })

	var wg sync.WaitGroup
	errc := make(chan error, 8)
	serve := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && svcCtx.Err() == nil {
				errc <- fmt.Errorf("site: %s: %w", name, err)
				stop()
			}
		})
	}
	hs := s.httpServer()
	serve("http", func() error { return ignoreClosed(hs.Serve(l.http)) })
	var tftp *tftpServer
	if l.tftp != nil {
		tftp = s.newTFTPServer()
		serve("tftp", func() error { return tftp.Serve(l.tftp) })
	}
	for _, d := range l.dhcp {
		serve("dhcp "+d.name, func() error { return s.serveDHCP(d) })
	}
	wg.Go(func() { s.cache.run(svcCtx) })

	<-svcCtx.Done()
	grace, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	if err := hs.Shutdown(grace); err != nil {
		hs.Close()
	}
	cancel()
	if tftp != nil {
		tftp.Shutdown()
	}
	l.close()
	wg.Wait()
	stopReports()
	reportsDone.Wait()
	s.log.Info("stopped")
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}
