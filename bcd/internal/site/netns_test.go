package site

// The DHCP tests run the site and real clients on two network namespaces joined by a veth pair:
//
//	namespace <id>s: site0 192.0.2.1/24  <——veth——>  namespace <id>c: mach0 (the machine)
//
// The site runs in a child process: this test binary re-executed under `ip netns exec`, so that
// every socket it opens (DHCP, TFTP's per-transfer sockets, HTTP) is in the site's namespace.
// The child speaks lines on stdin/stdout: "plan <json>" in, "ready <json>" and "plan ok" out.
// Clients run in the machine's namespace: busybox under `ip netns exec`, and the library's
// nclient4 and pin/tftp's client from this process, on a goroutine locked to an OS thread that
// setns(2) moved there for as long as they create their sockets.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal/siteapi"
)

const (
	childEnv = "BCD_SITE_TEST_CHILD"
	nsPrefix = "bcdsite"
)

// The addresses inside the test namespaces (TEST-NET-1, never routed; nothing leaves them).
var (
	nsSite    = netip.MustParseAddr("192.0.2.1")
	nsMachine = netip.MustParseAddr("192.0.2.2")
)

// childSpec is what the child site serves: the fixture under Dir, on the site's namespace.
type childSpec struct {
	Dir  string
	DHCP DHCPConfig
}

// runChild is the child: a site in the namespace it was started in, until its stdin closes.
func runChild(specJSON string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	out := &lineWriter{w: os.Stdout}
	cfg := fixtureConfig(spec.Dir, reportLines{out})
	// HTTP and TFTP where they listen by default: the site's address, on site0 only.
	cfg.Interface, cfg.Address, cfg.HTTPAddr, cfg.TFTPAddr, cfg.DHCP = "site0", nsSite, "", "", spec.DHCP
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { // ends with the process
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			cmd, arg, _ := strings.Cut(sc.Text(), " ")
			if cmd != "plan" {
				out.line("error unknown command %q", cmd)
				continue
			}
			var p siteapi.Plan
			if err := json.Unmarshal([]byte(arg), &p); err != nil {
				out.line("plan error %v", err)
			} else if err := s.SetPlan(p); err != nil {
				out.line("plan error %v", err)
			} else {
				out.line("plan ok")
			}
		}
		stop()
	}()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
		b, _ := json.Marshal(s.Addrs())
		out.line("ready %s", b)
	case err := <-done:
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	return 0
}

type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format+"\n", args...)
}

// reportLines is the child's Upstream: its reports, as lines on stdout.
type reportLines struct{ out *lineWriter }

func (r reportLines) Report(_ context.Context, kind string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	r.out.line("report %s %s", kind, b)
	return nil
}

// netns is a pair of namespaces joined by a veth pair, deleted when the test ends.
type netns struct {
	site, machine string
}

var netnsSeq atomic.Int32

// newNetns makes the namespaces, or skips the test where it cannot: not root, no `ip`, or a
// kernel or container that does not let root create them.
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: the DHCP tests create network namespaces, which needs root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipped: the DHCP tests need `ip` (Debian package iproute2)")
	}
	removeStaleNetns(t)
	id := fmt.Sprintf("%s%d-%d", nsPrefix, os.Getpid(), netnsSeq.Add(1))
	n := &netns{site: id + "s", machine: id + "c"}
	t.Cleanup(func() { // registered first: it runs even when the setup below fails halfway
		for _, ns := range []string{n.site, n.machine} {
			if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
				if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
					t.Errorf("ip netns del %s: %v: %s", ns, err, out)
				}
			}
		}
	})
	if out, err := exec.Command("ip", "netns", "add", n.site).CombinedOutput(); err != nil {
		if bytes.Contains(out, []byte("not permitted")) {
			t.Skipf("skipped: root may not create network namespaces here: %s", out)
		}
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	mustIP(t, "netns", "add", n.machine)
	mustIP(t, "link", "add", "name", "site0", "netns", n.site, "type", "veth", "peer", "name", "mach0", "netns", n.machine)
	mustIP(t, "-n", n.site, "addr", "add", nsSite.String()+"/24", "dev", "site0")
	mustIP(t, "-n", n.machine, "link", "set", "mach0", "address", macRamdisk)
	for _, l := range [][2]string{{n.site, "site0"}, {n.site, "lo"}, {n.machine, "mach0"}, {n.machine, "lo"}} {
		mustIP(t, "-n", l[0], "link", "set", l[1], "up")
	}
	return n
}

func mustIP(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// removeStaleNetns deletes the namespaces of test processes that died without cleaning up.
func removeStaleNetns(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		pid, _, _ := strings.Cut(rest, "-")
		if n, err := strconv.Atoi(pid); ok && err == nil {
			if _, err := os.Stat(fmt.Sprint("/proc/", n)); os.IsNotExist(err) {
				t.Logf("removing namespace %s of a test process gone", name)
				exec.Command("ip", "netns", "del", name).Run()
			}
		}
	}
}

// run runs a command in the machine's namespace.
func (n *netns) run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.machine, name}, args...)...).CombinedOutput()
	return string(out), err
}

// inMachine runs fn on an OS thread moved into the machine's namespace: the sockets fn creates
// are that namespace's, and stay so once fn returns.
func (n *netns) inMachine(fn func() error) error { return inNetns(n.machine, fn) }

// inNetns runs fn on an OS thread moved into the namespace ns.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Unlocked only once back home: otherwise the thread exits with this goroutine.
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer home.Close()
		there, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- err
			return
		}
		defer there.Close()
		if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// childSite is the site running in the site's namespace.
type childSite struct {
	stdin io.WriteCloser
	lines chan string
	addrs Addrs
}

func (n *netns) startSite(t *testing.T, dhcp DHCPConfig) *childSite {
	t.Helper()
	dir := t.TempDir()
	fixture(t, dir, nil)
	spec, err := json.Marshal(childSpec{Dir: dir, DHCP: dhcp})
	must(t, err)
	cmd := exec.Command("ip", "netns", "exec", n.site, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with this test binary
	var stderr computetest.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	c := &childSite{stdin: stdin, lines: make(chan string, 1024)}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // nobody reads reports here; never block the child
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close() // the child stops at the end of its input
		select {
		case <-readerDone:
		case <-time.After(20 * time.Second):
			t.Error("the child site did not stop 20 s after its input closed: killed")
			cmd.Process.Kill()
			<-readerDone
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("child site: %v", err)
		}
		if t.Failed() {
			t.Logf("child site's log:\n%s", stderr.String())
		}
	})
	line := c.await(t, "ready ")
	must(t, json.Unmarshal([]byte(line), &c.addrs))
	return c
}

// await returns the rest of the next line with prefix, skipping reports.
func (c *childSite) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the child site ended before saying %q", prefix)
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
			if strings.HasPrefix(l, "plan error") || strings.HasPrefix(l, "error") {
				t.Fatalf("child site: %s", l)
			}
		case <-timeout:
			t.Fatalf("the child site did not say %q in 10 s", prefix)
		}
	}
}

func (c *childSite) setPlan(t *testing.T, p siteapi.Plan) {
	t.Helper()
	b, err := json.Marshal(p)
	must(t, err)
	_, err = fmt.Fprintf(c.stdin, "plan %s\n", b)
	must(t, err)
	c.await(t, "plan ok")
}
