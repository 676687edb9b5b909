package pid1

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/better-compute/compute/computetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is an Init running in a test, stopped at the test's end.
type running struct {
	f       *fakeSystem
	cancel  context.CancelFunc
	done    chan error
	ramdisk chan string // each command line the ramdisk was started with
}

// start runs init on f with cfg (System and Ramdisk filled in); ramdisk, if not nil, is what
// the ramdisk does on each start (its index counts from 0), else it waits for ctx.
func start(t *testing.T, f *fakeSystem, cfg Config, ramdisk func(ctx context.Context, n int, log *slog.Logger) error) *running {
	t.Helper()
	r := &running{f: f, done: make(chan error, 1), ramdisk: make(chan string, 100)}
	var mu sync.Mutex
	n := 0
	cfg.System = f
	cfg.Ramdisk = func(ctx context.Context, cmdline string, log *slog.Logger) error {
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		log.Info("the ramdisk runs", "start", i) // before the test hears of it, and reads the console
		r.ramdisk <- cmdline
		if ramdisk != nil {
			return ramdisk(ctx, i, log)
		}
		<-ctx.Done()
		return nil
	}
	if cfg.RetryWait == 0 {
		cfg.RetryWait = 10 * time.Millisecond
	}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- in.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("console:\n%s", f.Console())
		}
	})
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run returned %v after its context ended; want nil", err)
		}
		r.done <- nil // a second stop returns at once
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// waitRamdisk waits for the ramdisk's nth start (from 1).
func (r *running) waitRamdisk(t *testing.T, nth int) string {
	t.Helper()
	var c string
	for range nth {
		select {
		case c = <-r.ramdisk:
		case <-time.After(10 * time.Second):
			t.Fatalf("the ramdisk was not started %d times; calls: %q", nth, r.f.Calls())
		}
	}
	return c
}

// sortRuns sorts each run of calls that share a first word and happen at once (the DHCP
// requests on several links), so that calls can be compared.
func sortRuns(calls []string, word string) []string {
	out := slices.Clone(calls)
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && strings.HasPrefix(out[j], word+" ") {
			j++
		}
		if j > i {
			slices.Sort(out[i:j])
			i = j
		} else {
			i++
		}
	}
	return out
}

func count(calls []string, prefix string) int {
	n := 0
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

var bootCalls = []string{
	"mount proc proc /proc nosuid=true nodev=true noexec=true ",
	"mount sysfs sysfs /sys nosuid=true nodev=true noexec=true ",
	"mount devtmpfs devtmpfs /dev nosuid=true nodev=false noexec=false mode=0755",
	"mount tmpfs tmpfs /tmp nosuid=true nodev=true noexec=false mode=1777",
	"mount tmpfs tmpfs /run nosuid=true nodev=true noexec=false mode=0755",
	"open console",
	"load virtio_ring.ko",
	"load virtio.ko",
	"load virtio_net.ko",
	"up lo",
	"up eth0",
	"up eth1",
	"dhcp eth0",
	"dhcp eth1",
}

// TestBoot: init mounts /proc, /sys, /dev, /tmp and /run, then opens the console; loads the
// modules of the list in its order; brings up lo and the physical NICs (not a bridge); asks for
// a lease on all of them; configures the first lease given, writes resolv.conf from it; then
// starts the ramdisk with the kernel's command line, logging to the console. Its context's end
// stops it, and every goroutine it started.
func TestBoot(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.dhcp = func(ctx context.Context, link string) (Lease, error) {
		if link == "eth1" {
			return blockDHCP(ctx, link)
		}
		return testLease(link, "10.0.2.15/24"), nil
	}
	r := start(t, f, Config{}, nil)
	if got := r.waitRamdisk(t, 1); got != "console=ttyS0 bcd.site=http://10.0.2.2:8067 panic=-1\n" {
		t.Errorf("the ramdisk got the command line %q", got)
	}
	want := append(slices.Clone(bootCalls), "configure eth0 10.0.2.15/24 via 10.0.2.2", "write /etc/resolv.conf")
	if d := cmp.Diff(want, sortRuns(f.Calls(), "dhcp")); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}
	if got, want := f.File("/etc/resolv.conf"), "# written by bcd init from the DHCP lease on eth0\nnameserver 10.0.2.3\nsearch lab.example\n"; got != want {
		t.Errorf("resolv.conf = %q, want %q", got, want)
	}
	con := f.Console()
	for _, s := range []string{"kernel modules loaded", "loaded=3 failed=0", "network configured", "link=eth0", "address=10.0.2.15/24",
		"the ramdisk runs", "starting bcd ramdisk"} {
		if !strings.Contains(con, s) {
			t.Errorf("the console does not say %q:\n%s", s, con)
		}
	}
	if strings.Contains(con, "not seeded") {
		t.Errorf("a seeded random number generator was reported unseeded:\n%s", con)
	}
	r.stop(t)
	if n := count(f.Calls(), "renew"); n != 0 {
		t.Errorf("an hour's lease was renewed %d times in a moment", n)
	}
}

// TestRetry: a ramdisk that fails, panics or returns is started again after RetryWait, with
// what was done before (mounts, modules, lease) not done again; each failure is logged.
func TestRetry(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, f, Config{}, func(ctx context.Context, n int, _ *slog.Logger) error {
		switch n {
		case 0:
			return errors.New("inspect: the machine has no MAC")
		case 1:
			panic("boom")
		case 2:
			return nil
		}
		<-ctx.Done()
		return nil
	})
	r.waitRamdisk(t, 4)
	calls := f.Calls()
	for prefix, want := range map[string]int{"mount ": 5, "open console": 1, "load ": 3, "dhcp ": 2, "configure ": 1, "up eth0": 1} {
		if got := count(calls, prefix); got != want {
			t.Errorf("%d calls %q…, want %d: %q", got, prefix, want, calls)
		}
	}
	con := f.Console()
	for _, s := range []string{`"bcd init: bcd ramdisk: inspect: the machine has no MAC" retryIn=10ms`, "bcd init: panic: boom", "goroutine",
		`"bcd init: bcd ramdisk returned"`} {
		if !strings.Contains(con, s) {
			t.Errorf("the console does not say %q:\n%s", s, con)
		}
	}
}

// TestMountFails: a mount that fails is logged, and the mounts are tried again.
func TestMountFails(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.mountErr["/sys"] = syscall.EPERM
	// Before /dev is mounted there is no /dev/console to open: the log is Config.Console's.
	var log computetest.Buffer
	r := start(t, f, Config{Console: &log}, nil)
	r.waitRamdisk(t, 1)
	calls := f.Calls()
	if got := count(calls, "mount sysfs"); got != 2 {
		t.Errorf("/sys mounted %d times, want 2 (a failure, then again): %q", got, calls)
	}
	if got := count(calls, "open console"); got != 0 {
		t.Errorf("/dev/console opened with a Config.Console: %q", calls)
	}
	if !strings.Contains(log.String(), "mounting sysfs on /sys: operation not permitted") {
		t.Errorf("the log does not name the failed mount:\n%s", log.String())
	}
}

// TestModules: a module that does not load is logged and the rest still load; without a list
// no module is loaded and init goes on.
func TestModules(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.moduleErr["/lib/modules/v/kernel/virtio.ko"] = syscall.ENOEXEC
	r := start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	if got := count(f.Calls(), "load "); got != 3 {
		t.Errorf("%d modules loaded, want all 3 tried: %q", got, f.Calls())
	}
	for _, s := range []string{"a kernel module did not load", "module=virtio ", "exec format error", "loaded=2 failed=1"} {
		if !strings.Contains(f.Console(), s) {
			t.Errorf("the console does not say %q:\n%s", s, f.Console())
		}
	}

	f = newFake()
	delete(f.files, "/etc/bcd/modules")
	r = start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	if got := count(f.Calls(), "load "); got != 0 {
		t.Errorf("%d modules loaded without a list", got)
	}
	if !strings.Contains(f.Console(), "no module list; loading no kernel modules") {
		t.Errorf("the console does not say the list is missing:\n%s", f.Console())
	}

	f = newFake()
	f.files["/etc/bcd/modules"] = []byte("virtio.ko\n")
	r = start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	if got := count(f.Calls(), "load "); got != 0 || !strings.Contains(f.Console(), "the module list is not valid") {
		t.Errorf("a bad list: %d loads; console:\n%s", got, f.Console())
	}
}

// TestLinks: init waits for a NIC to appear; with none after LinkWait it says so, naming the
// interfaces it saw, and tries again — taking a NIC that appeared meanwhile.
func TestLinks(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.linksAfter = 3 // the driver is still probing
	r := start(t, f, Config{LinkWait: 5 * time.Second}, nil)
	r.waitRamdisk(t, 1)
	if n := count(f.Calls(), "configure eth"); n != 1 {
		t.Errorf("%d leases configured after the NICs appeared, want 1: %q", n, f.Calls())
	}

	f = newFake()
	f.links = []Link{{Name: "lo"}, {Name: "br0", MAC: "52:54:00:00:00:03"}}
	start(t, f, Config{LinkWait: 20 * time.Millisecond}, nil)
	f.await(t, "init to report that it has no NIC", func() bool {
		return strings.Contains(f.Console(), "no physical NIC after 20ms (interfaces: [lo br0]): is its driver among the ramdisk's modules (mkramdisk -modules)?")
	})
	f.mu.Lock()
	f.links = append(f.links, Link{Name: "enp1s0", MAC: "52:54:00:00:00:09", Physical: true})
	f.mu.Unlock()
	f.await(t, "init to configure the NIC that appeared", func() bool { return count(f.Calls(), "configure enp1s0") == 1 })
	if n := count(f.Calls(), "up br0"); n != 0 {
		t.Errorf("a bridge was brought up as a NIC: %q", f.Calls())
	}
}

// TestDHCP: of several NICs the first lease given is configured (not a NIC that never answers,
// nor one that fails), and the requests still waiting are stopped before init goes on. An
// unseeded random number generator, which DHCP waits for, is reported.
func TestDHCP(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.noRandom = true
	f.links = []Link{{Name: "eth0", Physical: true}, {Name: "eth1", Physical: true}, {Name: "eth2", Physical: true}}
	// eth1 answers only once eth2 has failed: a failure must not end the search.
	eth2Failed := make(chan struct{})
	var failOnce sync.Once
	f.dhcp = func(ctx context.Context, link string) (Lease, error) {
		switch link {
		case "eth0":
			_, err := blockDHCP(ctx, link)
			f.mu.Lock()
			f.record("dhcp eth0 stopped: %v", err)
			f.mu.Unlock()
			return Lease{}, err
		case "eth1":
			select {
			case <-eth2Failed:
			case <-ctx.Done():
				return Lease{}, ctx.Err()
			}
			return testLease(link, "192.168.7.20/24"), nil
		}
		failOnce.Do(func() { close(eth2Failed) })
		return Lease{}, errors.New("the raw socket refused")
	}
	r := start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	calls := f.Calls()
	stopped, configured := slices.Index(calls, "dhcp eth0 stopped: context canceled"), slices.Index(calls, "configure eth1 192.168.7.20/24 via 10.0.2.2")
	if stopped < 0 || configured < 0 || stopped > configured {
		t.Errorf("want eth0's request stopped, then eth1's lease configured: %q", calls)
	}
	if n := count(calls, "configure "); n != 1 {
		t.Errorf("%d leases configured, want 1: %q", n, calls)
	}
	if !strings.Contains(f.Console(), "random number generator is not seeded yet, and DHCP waits for it") {
		t.Errorf("the console does not warn of the unseeded generator:\n%s", f.Console())
	}
}

// TestDHCPNoAnswer: when no NIC is given a lease within DHCPTimeout init says so, naming each
// NIC's failure, and asks again; a lease that cannot be configured is asked for again too.
func TestDHCPNoAnswer(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.dhcp = blockDHCP
	f.configErr = syscall.EEXIST
	start(t, f, Config{DHCPTimeout: 30 * time.Millisecond}, nil)
	f.await(t, "init to report no answer", func() bool {
		con := f.Console()
		return strings.Contains(con, "no DHCP lease within 30ms on eth0, eth1 (") && strings.Contains(con, "eth0: context deadline exceeded") &&
			strings.Contains(con, "eth1: context deadline exceeded")
	})
	f.mu.Lock()
	f.dhcp = nil // a server answers now
	f.mu.Unlock()
	f.await(t, "the lease configured after one failure to", func() bool { return count(f.Calls(), "configure ") == 2 })
	if !strings.Contains(f.Console(), "with 10.0.2.15/24: file exists") {
		t.Errorf("the console does not name the failed configuration:\n%s", f.Console())
	}
}

// TestKeepLease: the lease is renewed from T1 on; a renewal that changes the address is
// configured; failed renewals are tried again, and once the lease has ended a new one is asked
// for on its link and configured.
func TestKeepLease(t *testing.T) {
	t.Parallel()
	f := newFake()
	short := func(link, addr string) Lease {
		l := testLease(link, addr)
		l.Duration, l.RenewAfter = 300*time.Millisecond, 50*time.Millisecond
		return l
	}
	var mu sync.Mutex
	dhcps, renewals := 0, 0
	f.dhcp = func(ctx context.Context, link string) (Lease, error) {
		if link != "eth0" {
			return blockDHCP(ctx, link)
		}
		mu.Lock()
		defer mu.Unlock()
		dhcps++
		if dhcps == 1 {
			return short(link, "10.0.2.15/24"), nil
		}
		l := testLease(link, "10.0.2.30/24") // the last: an hour
		return l, nil
	}
	f.renew = func(_ context.Context, l Lease) (Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		renewals++
		switch renewals {
		case 1:
			return short(l.Link, "10.0.2.15/24"), nil // the same
		case 2:
			return short(l.Link, "10.0.2.16/24"), nil // moved
		}
		return Lease{}, errors.New("no answer") // until the lease ends
	}
	start(t, f, Config{RetryWait: 20 * time.Millisecond}, nil)
	f.await(t, "a new lease after the old one ended", func() bool { return count(f.Calls(), "configure eth0 10.0.2.30/24") == 1 })
	var configs []string
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, "configure ") {
			configs = append(configs, c)
		}
	}
	want := []string{"configure eth0 10.0.2.15/24 via 10.0.2.2", "configure eth0 10.0.2.16/24 via 10.0.2.2", "configure eth0 10.0.2.30/24 via 10.0.2.2"}
	if d := cmp.Diff(want, configs); d != "" {
		t.Errorf("configurations (-want +got):\n%s", d)
	}
	calls := f.Calls()
	if i, j := slices.Index(calls, "renew eth0 10.0.2.16/24"), slices.Index(calls, "configure eth0 10.0.2.30/24 via 10.0.2.2"); i < 0 || j < i {
		t.Errorf("the moved lease was not renewed before it ended: %q", calls)
	}
	for _, s := range []string{"the lease was not renewed; trying again", "the lease ended; asking for a new one"} {
		if !strings.Contains(f.Console(), s) {
			t.Errorf("the console does not say %q:\n%s", s, f.Console())
		}
	}
}

// TestNew: durations must not be negative (the error names the field); zeros are the
// defaults.
func TestNew(t *testing.T) {
	t.Parallel()
	for _, field := range []string{"RetryWait", "LinkWait", "DHCPTimeout"} {
		var cfg Config
		switch field {
		case "RetryWait":
			cfg.RetryWait = -time.Second
		case "LinkWait":
			cfg.LinkWait = -time.Second
		case "DHCPTimeout":
			cfg.DHCPTimeout = -time.Second
		}
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Config."+field+" -1s is negative") {
			t.Errorf("New with a negative %s = %v", field, err)
		}
	}
	in, err := New(Config{System: newFake()})
	if err != nil {
		t.Fatal(err)
	}
	if in.cfg.RetryWait != RetryWaitDefault || in.cfg.LinkWait != LinkWaitDefault || in.cfg.DHCPTimeout != DHCPTimeoutDefault || in.cfg.Ramdisk == nil {
		t.Errorf("defaults not filled: %+v", in.cfg)
	}
}

// TestRunRamdisk: the ramdisk is started as bcd ramdisk: a command line without bcd.site= is
// an error that says so.
func TestRunRamdisk(t *testing.T) {
	t.Parallel()
	err := runRamdisk(context.Background(), "console=ttyS0 panic=-1", slog.Default())
	if err == nil || !strings.Contains(err.Error(), "bcd.site= is missing from the kernel command line") {
		t.Errorf("runRamdisk without bcd.site= = %v", err)
	}
}

// TestDHCPOnTheBootNIC: with BOOTIF= on the command line (the site's script gives it), the NIC
// the machine booted from is asked alone, though another would answer sooner; when it does not
// answer, every NIC is asked.
func TestDHCPOnTheBootNIC(t *testing.T) {
	t.Parallel()
	f := newFake()
	f.files["/proc/cmdline"] = []byte("console=ttyS0 bcd.site=http://10.0.2.2:8067 bcd.token=t BOOTIF=01-52-54-00-00-00-02\n")
	// Every NIC answers at once: only the boot NIC's being asked at all shows it was chosen.
	f.dhcp = func(ctx context.Context, link string) (Lease, error) {
		return testLease(link, "10.0.2.15/24"), nil
	}
	r := start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	if calls := f.Calls(); count(calls, "dhcp ") != 1 || !slices.Contains(calls, "dhcp eth1") || !slices.Contains(calls, "configure eth1 10.0.2.15/24 via 10.0.2.2") {
		t.Errorf("want a lease asked for and configured on eth1 alone, the boot NIC: %q", calls)
	}
	r.stop(t)

	f = newFake()
	f.files["/proc/cmdline"] = []byte("bcd.site=http://10.0.2.2:8067 bcd.token=t BOOTIF=01-52-54-00-00-00-02\n")
	f.dhcp = func(ctx context.Context, link string) (Lease, error) {
		if link == "eth1" {
			return blockDHCP(ctx, link)
		}
		return testLease(link, "10.0.2.16/24"), nil
	}
	r = start(t, f, Config{DHCPTimeout: 50 * time.Millisecond}, nil)
	r.waitRamdisk(t, 1)
	if calls := f.Calls(); !slices.Contains(calls, "configure eth0 10.0.2.16/24 via 10.0.2.2") || !strings.Contains(f.Console(), "no lease on the NIC the machine booted from") {
		t.Errorf("want eth0's lease after the boot NIC's silence: %q\n%s", calls, f.Console())
	}
}
