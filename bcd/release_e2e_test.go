package main

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/selfupdate"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/releases/releasetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// cutProxy is a TCP proxy in front of the gateway that a test can cut: every connection closed
// and new ones refused, as a network that drops a node would.
type cutProxy struct {
	addr string
	mu   sync.Mutex
	cut  bool
	live map[net.Conn]bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), live: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.live[c], p.live[up] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.live {
			c.Close()
		}
		p.live = map[net.Conn]bool{}
	}
}

// supervised is a node run by bcd supervise: the supervisor and whatever binary it runs are
// one process group, which the harness kills when the test ends.
type supervised struct {
	name, state string
	*proc
}

func (e *e2e) supervise(bin, name, state, gateway string) *supervised {
	e.t.Helper()
	cmd := exec.Command(bin, "supervise", "--state-dir", state, "--log-level", "info", "--",
		"node", "--cdi-dir", e.t.TempDir(), "--gateway", gateway, "--fake-gpus", "1", "--update-deadline", "10s", "--log-level", "info")
	return &supervised{name: name, state: state, proc: e.start("bcd supervise "+name, cmd)}
}

func (n *supervised) slots() selfupdate.Slots {
	return selfupdate.Slots{Dir: filepath.Join(n.state, "slots")}
}

func sum(t *testing.T, path string) [32]byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}
	}
	return sha256.Sum256(b)
}

// TestSelfUpdateAndRollouts runs two real bcd nodes under bcd supervise, started on the test's
// build of bcd (version dev), and rolls real builds out to them through the signed repository:
// v2 in two waves (each node installs the verified build into its other slot, re-execs, and
// reconnects reporting v2); then v3, a real build that cannot reach the gateway (the network is
// cut as it starts), which rolls itself back at its deadline so that the node comes back on v2,
// the wave fails and the rollout pauses with the second node untouched, and is rolled back; then
// a build that exits at once, which the supervisor rolls back, and the rollout with it. The
// failing waves have the shortest deadline the API takes (10s), and the nodes' updates 10s to
// reach the gateway: what the test waits for is those deadlines.
func TestSelfUpdateAndRollouts(t *testing.T) {
	t.Parallel()
	versions := []string{"v2.0.0", "v3.0.0"}
	for _, v := range versions {
		prebuild("bcd-"+v, ".", "-ldflags", "-X github.com/better-compute/compute/bcd/app.version="+v) // side by side
	}
	e := newE2E(t, e2eOptions{TokenUses: 2})
	ctx := context.Background()
	url, a, env := e.URL, e.API, e.Env
	proxy := newCutProxy(t, e.Gateway)
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range versions {
		bins[v] = bcdVersion(t, v)
	}
	exits := filepath.Join(dir, "bcd-exits")
	if err := os.WriteFile(exits, []byte("#!/bin/sh\necho 'bcd v4: broken' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bins["v4.0.0-exits"] = exits

	repo := releasetest.Init(t, env, url)
	builds := map[tufrepo.Build][]byte{}
	for v, path := range bins {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		builds[tufrepo.Build{Version: v, OS: runtime.GOOS, Arch: runtime.GOARCH}] = b
	}
	if p := repo.Publish(t, builds); len(p.Added) != 3 {
		t.Fatalf("published %+v", p)
	}
	tok := e.Token
	var nodes []*supervised
	for _, name := range []string{"n0", "n1"} {
		state := t.TempDir()
		if out, err := exec.Command(e.Bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", name, "--ca-hash", tok.CAHash).CombinedOutput(); err != nil {
			t.Fatalf("join %s: %v\n%s", name, err, out)
		}
		nodes = append(nodes, e.supervise(e.Bin, name, state, proxy.addr))
	}
	version := func(name string) (string, bool) {
		var v string
		var online bool
		_ = e.DB.Pool.QueryRow(ctx, `SELECT coalesce(s.agent_version, ''), n.status = 'online' FROM compute.nodes n
			LEFT JOIN compute.node_sessions s ON s.node_id = n.id WHERE n.name = $1`, name).Scan(&v, &online)
		return v, online
	}
	on := func(name, want string) func() bool {
		return func() bool { v, online := version(name); return online && v == want }
	}
	for _, n := range nodes {
		computetest.Eventually(t, e2eWait, n.name+" online on the test's build", on(n.name, "dev"))
	}
	get := func(id string) api.Rollout {
		r, err := a.Rollouts.Get(ctx, e.RootKey, api.RolloutRef{Rollout: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitRollout := func(id, state string, within time.Duration) api.Rollout {
		var r api.Rollout
		computetest.Eventually(t, within, "rollout "+state, func() bool { r = get(id); return r.State == state })
		return r
	}

	// v2, one node at a time: two waves, each node re-exec'd into its other slot.
	r, err := a.Rollouts.Create(ctx, e.RootKey, api.CreateRollout{Pool: e2ePool, Release: "v2.0.0", MaxUnavailable: 1, WaveDeadline: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	r = waitRollout(r.ID, api.RolloutSucceeded, 3*time.Minute)
	if len(r.Waves) != 2 || r.Updated != 2 {
		t.Fatalf("the v2 rollout: %+v", r)
	}
	for _, n := range nodes {
		if v, online := version(n.name); v != "v2.0.0" || !online {
			t.Fatalf("%s reports %q (online %v) after the rollout", n.name, v, online)
		}
		s := n.slots()
		if cur, _, _ := s.Current(); cur != selfupdate.SlotB || sum(t, s.Path(selfupdate.SlotB)) != sha256.Sum256(builds[tufrepo.Build{Version: "v2.0.0", OS: runtime.GOOS, Arch: runtime.GOARCH}]) {
			t.Fatalf("%s: current slot %s does not hold v2", n.name, cur)
		}
		computetest.Eventually(t, e2eWait, n.name+"'s trial ended", func() bool { tr, _ := s.Trial(); return tr == nil })
		waitStatus(t, s.CurrentPath(), n.state, n.name+"'s status, running v2.0.0", func(st status) bool { return st.Running && st.Version == "v2.0.0" })
	}

	// v3 cannot reach its gateway: the network is cut once its build is in n0's other slot,
	// before it starts. It rolls itself back at its deadline; the node returns on v2.
	n0 := nodes[0]
	v3sum := sha256.Sum256(builds[tufrepo.Build{Version: "v3.0.0", OS: runtime.GOOS, Arch: runtime.GOARCH}])
	// The cut must come between the install and the new binary's first connection: the install
	// renames the verified build into the slot, which inotify tells at once.
	installed := renamedInto(t, n0.slots().Path(selfupdate.SlotA))
	r, err = a.Rollouts.Create(ctx, e.RootKey, api.CreateRollout{Pool: e2ePool, Release: "v3.0.0", WaveDeadline: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-installed:
	case <-time.After(e2eWait):
		t.Fatal("v3 was not installed in n0's slot a")
	}
	proxy.setCut(true)
	if sum(t, n0.slots().Path(selfupdate.SlotA)) != v3sum {
		t.Fatal("n0's slot a changed, but not to v3")
	}
	computetest.Eventually(t, e2eWait, "n0 rolling v3 back", func() bool {
		rb, _ := n0.slots().LastRollback()
		return rb != nil && rb.Version == "v3.0.0"
	})
	rb, _ := n0.slots().LastRollback()
	if !strings.Contains(rb.Reason, "did not reach its gateway within 10s") {
		t.Fatalf("n0's rollback: %+v", rb)
	}
	proxy.setCut(false)
	computetest.Eventually(t, e2eWait, "n0 back on v2.0.0", on("n0", "v2.0.0"))
	r = waitRollout(r.ID, api.RolloutPaused, time.Minute)
	if !strings.Contains(r.Error, "wave 1 failed: n0 did not come back online on v3.0.0") || r.Nodes[1].Name != "n1" || r.Nodes[1].State != api.RolloutNodePending {
		t.Fatalf("the v3 rollout: %+v", r)
	}
	if v, _ := version("n1"); v != "v2.0.0" {
		t.Fatalf("n1, never in a wave, reports %s", v)
	}
	// Still told v3 (the rollout is paused, not rolled back), the node does not try it again, and
	// says why; nor while the rollout is rolled back, below.
	waitStatus(t, n0.slots().CurrentPath(), n0.state, "n0's status naming the release it rolled back", func(st status) bool {
		return st.Update != nil && strings.Contains(st.Update.Refused, "v3.0.0 was installed and rolled back")
	})
	if tr, _ := n0.slots().Trial(); tr != nil {
		t.Fatalf("n0 tried v3 again: %+v", tr)
	}
	if cur, _, _ := n0.slots().Current(); cur != selfupdate.SlotB {
		t.Fatalf("n0 runs slot %s after the rollback", cur)
	}
	r, err = a.Rollouts.Rollback(ctx, e.RootKey, api.RolloutRef{Rollout: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	r = waitRollout(r.ID, api.RolloutRolledBack, time.Minute)
	if again, _ := n0.slots().LastRollback(); again == nil || !again.At.Equal(rb.At) {
		t.Fatalf("n0 tried v3 again: its last rollback is %+v", again)
	}
	if r.Nodes[0].State != api.RolloutNodeReverted || r.Nodes[0].PreviousVersion != "v2.0.0" || r.Nodes[1].State != api.RolloutNodeSkipped {
		t.Fatalf("rolled back: %+v", r.Nodes)
	}

	// A build that exits at once: the supervisor rolls it back, the wave fails, and the rollout
	// rolls itself back.
	r, err = a.Rollouts.Create(ctx, e.RootKey, api.CreateRollout{Pool: e2ePool, Release: "v4.0.0-exits", WaveDeadline: "10s", OnFailure: api.OnFailureRollback})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "n0 rolling v4 back", func() bool {
		rb, _ := n0.slots().LastRollback()
		return rb != nil && rb.Version == "v4.0.0-exits"
	})
	if rb, _ := n0.slots().LastRollback(); !strings.Contains(rb.Reason, "exited during its trial") {
		t.Fatalf("n0's rollback: %+v", rb)
	}
	computetest.Eventually(t, e2eWait, "n0 back on v2.0.0", on("n0", "v2.0.0"))
	r = waitRollout(r.ID, api.RolloutRolledBack, time.Minute)
	if !strings.Contains(r.Error, "wave 1 failed") {
		t.Fatalf("the v4 rollout: %+v", r)
	}
	// n1 lost its session when the network was cut, and comes back in its reconnection's time.
	for _, n := range nodes {
		computetest.Eventually(t, e2eWait, n.name+" online on v2.0.0 at the end", on(n.name, "v2.0.0"))
	}
}

// renamedInto returns a channel closed once a file is renamed to path (as an install puts a
// verified build in place).
func renamedInto(t *testing.T, path string) <-chan struct{} {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "inotify") // read through the runtime's poller: Close ends a Read
	t.Cleanup(func() { f.Close() })
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	renamed := make(chan struct{})
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
				name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+ev.Len]), "\x00")
				if name == filepath.Base(path) {
					close(renamed)
					return
				}
				b = b[unix.SizeofInotifyEvent+ev.Len:]
			}
		}
	}()
	return renamed
}
