package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/selfupdate"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/releases/releasetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// buildVersion builds the real bcd reporting version.
func buildVersion(t *testing.T, dir, version string) string {
	t.Helper()
	bin := filepath.Join(dir, "bcd-"+version)
	out, err := exec.Command("go", "build", "-ldflags", "-X github.com/better-compute/compute/bcd/app.version="+version, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("build bcd %s: %v\n%s", version, err, out)
	}
	return bin
}

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

// supervised is a node run by bcd supervise, in a process group of its own so that the test
// ends the supervisor and whatever binary it runs together.
type supervised struct {
	name, state string
	cmd         *exec.Cmd
}

func startSupervised(t *testing.T, bin, name, state, gateway string) *supervised {
	t.Helper()
	cmd := exec.Command(bin, "supervise", "--state-dir", state, "--log-level", "warn", "--",
		"node", "--cdi-dir", t.TempDir(), "--gateway", gateway, "--fake-gpus", "1", "--update-deadline", "15s", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	return &supervised{name: name, state: state, cmd: cmd}
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

// TestSelfUpdateAndRollouts runs two real bcd nodes under bcd supervise and rolls real builds
// out to them through the signed repository: v2 in two waves (each node installs the verified
// build into its other slot, re-execs, and reconnects reporting v2); then v3, a real build that
// cannot reach the gateway (the network is cut as it starts), which rolls itself back at its
// deadline so that the node comes back on v2, the wave fails and the rollout pauses with the
// second node untouched, and is rolled back; then a build that exits at once, which the
// supervisor rolls back, and the rollout with it.
func TestSelfUpdateAndRollouts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs several bcd binaries")
	}
	dir := t.TempDir()
	bins := map[string]string{}
	for _, v := range []string{"v1.0.0", "v2.0.0", "v3.0.0"} {
		bins[v] = buildVersion(t, dir, v)
	}
	exits := filepath.Join(dir, "bcd-exits")
	if err := os.WriteFile(exits, []byte("#!/bin/sh\necho 'bcd v4: broken' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bins["v4.0.0-exits"] = exits

	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 300 * time.Millisecond }})
	ctx := context.Background()
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	proxy := newCutProxy(t, gw)
	a := env.Compute.API
	repo := releasetest.Init(t, env, url)
	builds := map[tufrepo.Build][]byte{}
	for v, path := range bins {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		builds[tufrepo.Build{Version: v, OS: runtime.GOOS, Arch: runtime.GOARCH}] = b
	}
	if p := repo.Publish(t, builds); len(p.Added) != 4 {
		t.Fatalf("published %+v", p)
	}
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "gpu"}); err != nil {
		t.Fatal(err)
	}
	tok, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "gpu", MaxUses: 2})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*supervised
	for _, name := range []string{"n0", "n1"} {
		state := t.TempDir()
		if out, err := exec.Command(bins["v1.0.0"], "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", name, "--ca-hash", tok.CAHash).CombinedOutput(); err != nil {
			t.Fatalf("join %s: %v\n%s", name, err, out)
		}
		nodes = append(nodes, startSupervised(t, bins["v1.0.0"], name, state, proxy.addr))
	}
	version := func(name string) (string, bool) {
		var v string
		var online bool
		_ = env.DB.Pool.QueryRow(ctx, `SELECT coalesce(s.agent_version, ''), n.status = 'online' FROM compute.nodes n
			LEFT JOIN compute.node_sessions s ON s.node_id = n.id WHERE n.name = $1`, name).Scan(&v, &online)
		return v, online
	}
	on := func(name, want string) func() bool {
		return func() bool { v, online := version(name); return online && v == want }
	}
	for _, n := range nodes {
		eventuallyWithin(t, n.name+" online on v1.0.0", 30*time.Second, on(n.name, "v1.0.0"))
	}
	get := func(id string) api.Rollout {
		r, err := a.Rollouts.Get(ctx, env.RootKey, api.RolloutRef{Rollout: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitRollout := func(id, state string, within time.Duration) api.Rollout {
		var r api.Rollout
		eventuallyWithin(t, "rollout "+state, within, func() bool { r = get(id); return r.State == state })
		return r
	}

	// v2, one node at a time: two waves, each node re-exec'd into its other slot.
	r, err := a.Rollouts.Create(ctx, env.RootKey, api.CreateRollout{Pool: "gpu", Release: "v2.0.0", MaxUnavailable: 1, WaveDeadline: "2m"})
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
		eventuallyWithin(t, n.name+"'s trial ended", 10*time.Second, func() bool { tr, _ := s.Trial(); return tr == nil })
		if pid := n.cmd.Process.Pid; pid <= 0 {
			t.Fatal("no supervisor")
		}
		var st struct {
			Version string `json:"version"`
			Running bool   `json:"running"`
		}
		eventuallyWithin(t, n.name+"'s status", 10*time.Second, func() bool {
			out, err := exec.Command(s.CurrentPath(), "status", "--json", "--state-dir", n.state).Output()
			return err == nil && json.Unmarshal(out, &st) == nil && st.Running && st.Version == "v2.0.0"
		})
	}

	// v3 cannot reach its gateway: the network is cut once its build is in n0's other slot,
	// before it starts. It rolls itself back at its deadline; the node returns on v2.
	n0 := nodes[0]
	v3sum := sha256.Sum256(builds[tufrepo.Build{Version: "v3.0.0", OS: runtime.GOOS, Arch: runtime.GOARCH}])
	// The cut must come between the install and the new binary's first connection: the install
	// is a rename, so the slot's file changes at once, and a stat every millisecond or two sees it
	// (hashing the binary each time, as this did, could see it after v3 had connected).
	inode := func() uint64 {
		fi, err := os.Stat(n0.slots().Path(selfupdate.SlotA))
		if err != nil {
			return 0
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	before := inode()
	r, err = a.Rollouts.Create(ctx, env.RootKey, api.CreateRollout{Pool: "gpu", Release: "v3.0.0", WaveDeadline: "45s"})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); inode() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for v3 in n0's slot a")
		}
	}
	proxy.setCut(true)
	if sum(t, n0.slots().Path(selfupdate.SlotA)) != v3sum {
		t.Fatal("n0's slot a changed, but not to v3")
	}
	eventuallyWithin(t, "n0 rolling v3 back", 45*time.Second, func() bool {
		rb, _ := n0.slots().LastRollback()
		return rb != nil && rb.Version == "v3.0.0"
	})
	rb, _ := n0.slots().LastRollback()
	if !strings.Contains(rb.Reason, "did not reach its gateway within 15s") {
		t.Fatalf("n0's rollback: %+v", rb)
	}
	proxy.setCut(false)
	eventuallyWithin(t, "n0 back on v2.0.0", 30*time.Second, on("n0", "v2.0.0"))
	r = waitRollout(r.ID, api.RolloutPaused, time.Minute)
	if !strings.Contains(r.Error, "wave 1 failed: n0 did not come back online on v3.0.0") || r.Nodes[1].Name != "n1" || r.Nodes[1].State != api.RolloutNodePending {
		t.Fatalf("the v3 rollout: %+v", r)
	}
	if v, _ := version("n1"); v != "v2.0.0" {
		t.Fatalf("n1, never in a wave, reports %s", v)
	}
	// Still told v3 (the rollout is paused, not rolled back), the node does not try it again, and
	// says why.
	var st struct {
		Update struct {
			Refused string `json:"refused"`
		} `json:"update"`
	}
	eventuallyWithin(t, "n0's status naming the release it rolled back", 10*time.Second, func() bool {
		out, err := exec.Command(n0.slots().CurrentPath(), "status", "--json", "--state-dir", n0.state).Output()
		return err == nil && json.Unmarshal(out, &st) == nil && strings.Contains(st.Update.Refused, "v3.0.0 was installed and rolled back")
	})
	time.Sleep(3 * time.Second)
	if tr, _ := n0.slots().Trial(); tr != nil {
		t.Fatalf("n0 tried v3 again: %+v", tr)
	}
	if cur, _, _ := n0.slots().Current(); cur != selfupdate.SlotB {
		t.Fatalf("n0 runs slot %s after the rollback", cur)
	}
	r, err = a.Rollouts.Rollback(ctx, env.RootKey, api.RolloutRef{Rollout: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	r = waitRollout(r.ID, api.RolloutRolledBack, time.Minute)
	if r.Nodes[0].State != api.RolloutNodeReverted || r.Nodes[0].PreviousVersion != "v2.0.0" || r.Nodes[1].State != api.RolloutNodeSkipped {
		t.Fatalf("rolled back: %+v", r.Nodes)
	}

	// A build that exits at once: the supervisor rolls it back, the wave fails, and the rollout
	// rolls itself back.
	r, err = a.Rollouts.Create(ctx, env.RootKey, api.CreateRollout{Pool: "gpu", Release: "v4.0.0-exits", WaveDeadline: "20s", OnFailure: api.OnFailureRollback})
	if err != nil {
		t.Fatal(err)
	}
	eventuallyWithin(t, "n0 rolling v4 back", time.Minute, func() bool {
		rb, _ := n0.slots().LastRollback()
		return rb != nil && rb.Version == "v4.0.0-exits"
	})
	if rb, _ := n0.slots().LastRollback(); !strings.Contains(rb.Reason, "exited during its trial") {
		t.Fatalf("n0's rollback: %+v", rb)
	}
	eventuallyWithin(t, "n0 back on v2.0.0", 30*time.Second, on("n0", "v2.0.0"))
	r = waitRollout(r.ID, api.RolloutRolledBack, time.Minute)
	if !strings.Contains(r.Error, "wave 1 failed") {
		t.Fatalf("the v4 rollout: %+v", r)
	}
	for _, n := range nodes {
		if v, online := version(n.name); v != "v2.0.0" || !online {
			t.Fatalf("%s reports %q (online %v) at the end", n.name, v, online)
		}
	}
}

func eventuallyWithin(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
