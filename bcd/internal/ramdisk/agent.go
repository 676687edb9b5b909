// Package ramdisk is bcd ramdisk: what runs in the small Linux a machine PXE-boots into at a
// site. It reads the site agent's address from the kernel command line (ParseCmdline), finds
// the machine's facts (Inspect), says Hello to the site, then asks for tasks and carries them
// out (Wipe, Stream, Verify, and a kexec, reboot or power-off), posting Progress, all over the
// HTTP API of metal/siteapi.
package ramdisk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// Defaults of Config's zero fields.
const (
	RootDefault         = "/"
	PollIntervalDefault = 5 * time.Second
	RetryMaxDefault     = 30 * time.Second
)

// requestTimeout bounds one request of the API (not an image or a kernel: those are large).
const requestTimeout = 30 * time.Second

// Config is what Run needs. Zero fields take the documented defaults; New checks the rest.
type Config struct {
	// Site is the site agent's base URL, as bcd.site= gives it (http://10.0.0.1:8067). Required.
	Site string
	// Token is the boot's token (bcd.token=), which the site gave this boot of the machine and
	// takes from the address of its lease only. Required.
	Token string
	// Machine is the machine's id (bcd.machine=); empty for a machine the site does not know
	// yet, which it learns at a Hello.
	Machine string
	// Root is where the machine's /sys, /proc and /dev are: RootDefault ("/"). Facts are read
	// under it and a task's disk "/dev/vda" is Root+"/dev/vda", so a test can give a fake tree
	// whose disks are regular files.
	Root string
	// Client makes the requests to the site. nil: a client of its own with timeouts to connect
	// (10 s) and for an answer's headers (30 s), no proxy, and no limit on a body's time.
	Client *http.Client
	// PollInterval is the wait between asks for a task while there is none, and between Hellos
	// while the site does not know the machine: PollIntervalDefault.
	PollInterval time.Duration
	// RetryMax is the longest wait between retries of a request that failed (the network, or
	// the site answering 5xx): the first wait is RetryMax/32, doubled at each failure up to
	// RetryMax, with jitter. RetryMaxDefault.
	RetryMax time.Duration
	// Kexec boots kernel with initrd ("" for none) and cmdline in place of the running kernel.
	// nil: kexec_file_load(2), then reboot(2) with LINUX_REBOOT_CMD_KEXEC. Tests inject their own.
	Kexec func(kernel, initrd, cmdline string) error
	// Reboot and PowerOff restart and power off the machine. nil: sync(2), then reboot(2) with
	// LINUX_REBOOT_CMD_RESTART or LINUX_REBOOT_CMD_POWER_OFF. Tests inject their own.
	Reboot, PowerOff func() error
	// Logger receives what the ramdisk does: nil is slog.Default().
	Logger *slog.Logger
}

// Agent is bcd ramdisk for one boot of a machine: made by New, run once by Run.
type Agent struct {
	cfg       Config
	ownClient bool
	log       *slog.Logger
	out       outbox

	helloMu sync.Mutex // one Hello at a time
	mu      sync.Mutex // guards what follows
	machine string
	token   string
	facts   siteapi.Facts
}

// New checks cfg and fills its zero fields with their defaults; it starts nothing. The
// caller's Config is not changed.
func New(cfg Config) (*Agent, error) {
	if cfg.Site == "" {
		return nil, errors.New("ramdisk: Config.Site is required: the site agent's base URL (bcd.site=)")
	}
	if err := checkSiteURL(cfg.Site); err != nil {
		return nil, fmt.Errorf("ramdisk: Config.Site: %w", err)
	}
	for len(cfg.Site) > 0 && cfg.Site[len(cfg.Site)-1] == '/' {
		cfg.Site = cfg.Site[:len(cfg.Site)-1]
	}
	if cfg.Token == "" {
		return nil, errors.New("ramdisk: Config.Token is required: the boot's token, which the site's iPXE script gives (bcd.token=)")
	}
	if cfg.Root == "" {
		cfg.Root = RootDefault
	}
	if st, err := os.Stat(cfg.Root); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("ramdisk: Config.Root %q is not a directory", cfg.Root)
	}
	switch {
	case cfg.PollInterval < 0:
		return nil, fmt.Errorf("ramdisk: Config.PollInterval %v is negative", cfg.PollInterval)
	case cfg.PollInterval == 0:
		cfg.PollInterval = PollIntervalDefault
	}
	switch {
	case cfg.RetryMax < 0:
		return nil, fmt.Errorf("ramdisk: Config.RetryMax %v is negative", cfg.RetryMax)
	case cfg.RetryMax == 0:
		cfg.RetryMax = RetryMaxDefault
	}
	a := &Agent{}
	if cfg.Client == nil {
		cfg.Client, a.ownClient = newClient(), true
	}
	if cfg.Kexec == nil {
		cfg.Kexec = kexec
	}
	if cfg.Reboot == nil {
		cfg.Reboot = reboot
	}
	if cfg.PowerOff == nil {
		cfg.PowerOff = powerOff
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a.cfg, a.log = cfg, cfg.Logger
	a.machine, a.token = cfg.Machine, cfg.Token
	return a, nil
}

// Run is New and Agent.Run.
func Run(ctx context.Context, cfg Config) error {
	a, err := New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Run inspects the machine, says Hello until the site names the machine and its token, then
// asks for tasks every PollInterval and carries out each task once, until ctx is done, when it
// returns nil once its requests and its progress poster have stopped. It returns an error only
// when the machine cannot be inspected (nothing would identify it to the site). Run is called
// once.
func (a *Agent) Run(ctx context.Context) error {
	if a.ownClient {
		defer a.cfg.Client.CloseIdleConnections()
	}
	var wg sync.WaitGroup
	defer wg.Wait() // the progress poster, stopped by cancel
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { a.out.run(ctx, a.postProgress) })

	in, err := Inspect(a.cfg.Root)
	if err != nil {
		return err
	}
	a.logInspection(in)
	a.mu.Lock()
	a.facts = in.Facts
	a.mu.Unlock()
	if err := a.hello(ctx); err != nil {
		return nil // ctx is done
	}

	done := map[string]bool{}
	for {
		task, err := a.nextTask(ctx)
		if err != nil {
			return nil // ctx is done
		}
		if task.ID == "" {
			a.log.Error("ramdisk: the site gave a task without an id; ignoring it", "kind", task.Kind)
		} else if !done[task.ID] {
			done[task.ID] = true
			a.carryOut(ctx, task)
			continue
		}
		if sleep(ctx, a.cfg.PollInterval) != nil {
			return nil
		}
	}
}

func (a *Agent) logInspection(in Inspection) {
	f := in.Facts
	a.log.Info("ramdisk: machine inspected", "serial", f.Serial, "serialFrom", in.SerialFrom,
		"vendor", f.Vendor, "model", f.Model, "cpus", f.CPUs, "memoryGiB", f.MemoryGiB,
		"macs", f.MACs, "disks", f.Disks, "gpus", f.GPUs)
	for _, n := range in.Notes {
		a.log.Info("ramdisk: inspect: " + n)
	}
}

// identity is the machine id the ramdisk speaks for now, and its boot's token.
func (a *Agent) identity() (machine, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.machine, a.token
}

func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: requestTimeout,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
	}}
}
