// Package pid1 is bcd init: bcd as the ramdisk's /init, the first process the kernel starts.
// It makes the machine ready for bcd ramdisk — mounts /proc, /sys, /dev and /tmp, loads the
// kernel modules the ramdisk carries in their order, brings up lo and the NICs and configures
// the first DHCP lease given on any of them (address, default route, /etc/resolv.conf) — then
// runs bcd ramdisk with the kernel's command line. As PID 1 it must never exit (the kernel
// panics when it does): a step that fails is logged to the console and tried again after a
// wait, a panic is recovered the same way, and exited children are reaped.
package pid1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/better-compute/compute/bcd/internal/ramdisk"
	"github.com/better-compute/compute/internal/lib/initramfs"
)

// Defaults of Config's zero fields.
const (
	RetryWaitDefault   = 10 * time.Second
	LinkWaitDefault    = 30 * time.Second
	DHCPTimeoutDefault = 15 * time.Second
)

// The files init reads.
const (
	cmdlinePath    = "/proc/cmdline"
	moduleListPath = "/" + initramfs.ModuleListPath
	resolvConfPath = "/etc/resolv.conf"
)

// mounts are the filesystems init mounts, in order: /dev before the console is opened.
var mounts = []Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", NoSuid: true, NoDev: true, NoExec: true},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", NoSuid: true, NoDev: true, NoExec: true},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", NoSuid: true, Data: "mode=0755"},
	{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", NoSuid: true, NoDev: true, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", NoSuid: true, NoDev: true, Data: "mode=0755"},
}

// Config is what Run needs. Zero fields take the documented defaults; New checks the rest.
type Config struct {
	// System is the machine init prepares: nil is Linux(). Tests give a fake.
	System System
	// Console receives init's and the ramdisk's logs. nil: /dev/console once /dev is mounted,
	// and standard error (where the kernel points PID 1's output) before.
	Console io.Writer
	// LogLevel is the least level logged.
	LogLevel slog.Level
	// Ramdisk runs bcd ramdisk with the kernel's command line, until ctx is done. nil: the
	// ramdisk package's ParseCmdline and Run.
	Ramdisk func(ctx context.Context, cmdline string, log *slog.Logger) error
	// RetryWait is the wait before a failed step is tried again: RetryWaitDefault.
	RetryWait time.Duration
	// LinkWait is how long init waits for a physical NIC to appear once the modules are
	// loaded, before the step fails (and is tried again): LinkWaitDefault.
	LinkWait time.Duration
	// DHCPTimeout is how long init asks for a lease on all NICs at once before the step fails:
	// DHCPTimeoutDefault.
	DHCPTimeout time.Duration
}

// Init is bcd init for one boot: made by New, run once by Run.
type Init struct {
	cfg Config
	sys System
	con *console
	log *slog.Logger

	// What is done already, so that a step tried again does not do it twice; only Run's
	// goroutine touches these.
	mounted, loaded bool
	lease           *Lease
}

// New checks cfg and fills its zero fields with their defaults; it touches nothing.
func New(cfg Config) (*Init, error) {
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{{"RetryWait", &cfg.RetryWait, RetryWaitDefault}, {"LinkWait", &cfg.LinkWait, LinkWaitDefault},
		{"DHCPTimeout", &cfg.DHCPTimeout, DHCPTimeoutDefault}} {
		switch {
		case *d.v < 0:
			return nil, fmt.Errorf("pid1: Config.%s %v is negative", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if cfg.System == nil {
		cfg.System = Linux()
	}
	if cfg.Ramdisk == nil {
		cfg.Ramdisk = runRamdisk
	}
	in := &Init{cfg: cfg, sys: cfg.System, con: &console{w: cfg.Console}}
	if cfg.Console == nil {
		in.con.w = os.Stderr
	}
	in.log = slog.New(slog.NewTextHandler(in.con, &slog.HandlerOptions{Level: cfg.LogLevel}))
	return in, nil
}

// Run prepares the machine and runs bcd ramdisk, trying each failed step again after
// RetryWait, and reaps exited children meanwhile. It returns only when ctx is done — never, for
// PID 1 — once the goroutines it started have stopped.
func (in *Init) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		in.con.close()
	}()
	sig := notifyChildExit() // before anything starts: no child's exit goes unheard
	wg.Go(func() { in.reap(ctx, sig) })
	for {
		err := in.boot(ctx, &wg)
		if ctx.Err() != nil {
			return nil
		}
		in.log.Error("bcd init: "+err.Error(), "retryIn", in.cfg.RetryWait)
		if sleep(ctx, in.cfg.RetryWait) != nil {
			return nil
		}
	}
}

// boot does what is not done yet: mount, load the modules, get a lease (and keep it, in a
// goroutine of wg), then runs the ramdisk. It returns why it stopped; a panic is an error.
func (in *Init) boot(ctx context.Context, wg *sync.WaitGroup) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	if !in.mounted {
		if err := in.mount(); err != nil {
			return err
		}
		in.mounted = true
	}
	if !in.loaded {
		in.loadModules()
		in.loaded = true
	}
	if in.lease == nil {
		l, err := in.network(ctx)
		if err != nil {
			return err
		}
		in.lease = &l
		wg.Go(func() { in.keepLease(ctx, l) })
	}
	cmdline, err := in.sys.ReadFile(cmdlinePath)
	if err != nil {
		return fmt.Errorf("reading the kernel command line: %w", err)
	}
	in.log.Info("bcd init: starting bcd ramdisk")
	if err := in.cfg.Ramdisk(ctx, string(cmdline), in.log); err != nil {
		return fmt.Errorf("bcd ramdisk: %w", err)
	}
	if ctx.Err() == nil {
		return errors.New("bcd ramdisk returned")
	}
	return nil
}

// mount mounts what the ramdisk needs, then sends the logs to /dev/console.
func (in *Init) mount() error {
	for _, m := range mounts {
		if err := in.sys.Mount(m); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", m.FSType, m.Target, err)
		}
	}
	in.log.Info("bcd init: mounted /proc, /sys, /dev, /tmp and /run")
	if in.cfg.Console == nil {
		c, err := in.sys.OpenConsole()
		if err != nil {
			in.log.Warn("bcd init: cannot open /dev/console; logging to standard error", "err", err)
		} else {
			in.con.set(c)
		}
	}
	return nil
}

// loadModules loads the modules of the ramdisk's list in its order. A module that does not
// load is logged and the rest are loaded: the machine may not need it, and what it does need
// fails later with a clearer error (no NIC, no disk).
func (in *Init) loadModules() {
	b, err := in.sys.ReadFile(moduleListPath)
	if errors.Is(err, os.ErrNotExist) {
		in.log.Warn("bcd init: no module list; loading no kernel modules", "list", moduleListPath)
		return
	}
	if err != nil {
		in.log.Error("bcd init: reading the module list; loading no kernel modules", "list", moduleListPath, "err", err)
		return
	}
	paths, err := initramfs.ParseModuleList(b)
	if err != nil {
		in.log.Error("bcd init: the module list is not valid; loading no kernel modules", "err", err)
		return
	}
	start, failed := time.Now(), 0
	for _, p := range paths {
		if err := in.sys.LoadModule(p); err != nil {
			failed++
			in.log.Error("bcd init: a kernel module did not load", "module", initramfs.ModuleName(p), "err", err)
			continue
		}
		in.log.Debug("bcd init: kernel module loaded", "module", initramfs.ModuleName(p))
	}
	in.log.Info("bcd init: kernel modules loaded", "loaded", len(paths)-failed, "failed", failed,
		"took", time.Since(start).Round(time.Millisecond))
}

// reap collects exited children whenever one exits (SIGCHLD), and every minute in case a
// signal was missed, until ctx is done. bcd ramdisk starts no process of its own, so taking
// every child's status steals none that someone waits for.
func (in *Init) reap(ctx context.Context, sig chan os.Signal) {
	defer stopNotify(sig)
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		case <-t.C:
		}
		if n := in.sys.Reap(); n > 0 {
			in.log.Debug("bcd init: reaped exited processes", "count", n)
		}
	}
}

// runRamdisk is bcd ramdisk, as the bcd ramdisk command runs it.
func runRamdisk(ctx context.Context, cmdline string, log *slog.Logger) error {
	site, machine, token, err := ramdisk.ParseCmdline(cmdline)
	if err != nil {
		return err
	}
	return ramdisk.Run(ctx, ramdisk.Config{Site: site, Machine: machine, Token: token, Logger: log})
}

// console is where logs go: standard error until /dev/console is open.
type console struct {
	mu     sync.Mutex
	w      io.Writer
	closer io.Closer
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Write(p)
}

func (c *console) set(w io.WriteCloser) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w, c.closer = w, w
}

func (c *console) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closer != nil {
		c.closer.Close()
		c.closer = nil
		c.w = io.Discard
	}
}

// sleep waits d, or until ctx is done (then it returns ctx's error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
