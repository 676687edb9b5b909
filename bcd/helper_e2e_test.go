package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/computetest"
)

// agentUID is the unprivileged user the node agent runs as in the helper test (nobody).
const agentUID = 65534

// syncBuffer is a process's output, written by its copier and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// as runs cmd as uid (and its gid), when it is not this process's.
func as(cmd *exec.Cmd, uid int) *exec.Cmd {
	if uid != os.Geteuid() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	return cmd
}

// TestAnUnprivilegedNodeThroughTheRootHelper runs bcd node as nobody (uid 65534) beside bcd
// helper as root, both real processes of the real binary, against a control plane on loopback:
// the node cannot write the runtime's spec directory (root's, 0755), yet a reservation's CDI
// spec appears there and goes with its release, a MIG slice is made by the helper's MIG, and a
// gpu.reset command is carried out by the helper. From the agent's user, bcd helper call is
// refused an unknown command and a directory outside the helper's roots; from another uid,
// everything.
func TestAnUnprivilegedNodeThroughTheRootHelper(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bcd binary")
	}
	if os.Geteuid() != 0 {
		t.Skip("runs bcd helper as root and bcd node as uid 65534: needs root")
	}
	// Not t.TempDir(): its parent is 0700, and nobody must reach the binary and its state.
	dir, err := os.MkdirTemp("", "bcd-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bcd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build bcd: %v\n%s", err, out)
	}
	state, cdiRoot, run := filepath.Join(dir, "state"), filepath.Join(dir, "cdi"), filepath.Join(dir, "run")
	for _, d := range []string{state, cdiRoot, run} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(state, agentUID, agentUID); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(run, "helper.sock")

	// The helper, as root.
	helperLog := &syncBuffer{}
	h := exec.Command(bin, "helper", "--socket", sock, "--allow-uid", "65534", "--cdi-root", cdiRoot, "--fake-gpus", "8")
	h.Stdout, h.Stderr = helperLog, helperLog
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	helperDone := make(chan error, 1)
	go func() { helperDone <- h.Wait() }()
	t.Cleanup(func() {
		_ = h.Process.Signal(syscall.SIGTERM)
		<-helperDone
		if t.Failed() {
			t.Logf("bcd helper:\n%s", helperLog.String())
		}
	})
	eventually(t, "the helper's socket", func() bool { _, err := os.Stat(sock); return err == nil })

	call := func(uid int, args ...string) (string, error) {
		out, err := as(exec.Command(bin, append([]string{"helper", "call", "--socket", sock}, args...)...), uid).CombinedOutput()
		return string(out), err
	}
	if out, err := call(agentUID, "hello"); err != nil || !strings.Contains(out, `"mig":true`) {
		t.Fatalf("hello from the agent's user: %v\n%s", err, out)
	}
	for _, bad := range []struct {
		what string
		uid  int
		args []string
		want string
	}{
		{"an unknown command", agentUID, []string{"exec", `{"argv":["/bin/sh"]}`}, "unknown_command"},
		{"a directory outside the roots", agentUID, []string{"cdi.remove", `{"dir":"/etc","name":"better-compute-x.json"}`}, "not_allowed"},
		{"a path out of a root", agentUID, []string{"cdi.list", `{"dir":"` + cdiRoot + `/../state"}`}, "not_allowed"},
		{"a caller of another uid", 65533, []string{"hello"}, "uid 65533 may not use this helper"},
	} {
		if out, err := call(bad.uid, bad.args...); err == nil || !strings.Contains(out, bad.want) {
			t.Errorf("%s: %v\n%s", bad.what, err, out)
		}
	}
	if !strings.Contains(helperLog.String(), "refused a caller of another uid") {
		t.Errorf("the helper did not log the refused uid:\n%s", helperLog.String())
	}

	// The control plane, and the node as nobody.
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 300 * time.Millisecond }})
	ctx := context.Background()
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	a := env.Compute.API
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	tok, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := as(exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", "nobody-node"), agentUID).CombinedOutput(); err != nil {
		t.Fatalf("join as nobody: %v\n%s", err, out)
	}
	// Without the helper, nobody cannot write the spec directory.
	if err := as(exec.Command("/bin/sh", "-c", "touch "+cdiRoot+"/probe"), agentUID).Run(); err == nil {
		t.Fatal("nobody can write the spec directory: the test would prove nothing")
	}
	node := as(exec.Command(bin, "node", "--state-dir", state, "--cdi-dir", cdiRoot, "--gateway", gw, "--fake-gpus", "8", "--helper", sock, "--log-level", "info"), agentUID)
	nodeLog := &syncBuffer{}
	node.Stdout, node.Stderr = nodeLog, nodeLog
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node.Wait() }()
	t.Cleanup(func() {
		_ = node.Process.Signal(syscall.SIGKILL)
		<-nodeDone
		if t.Failed() {
			t.Logf("bcd node:\n%s", nodeLog.String())
		}
	})
	var nodeID string
	eventually(t, "the node online with 8 GPUs", func() bool {
		list, err := a.Nodes.List(ctx, env.RootKey, api.ListNodes{Pool: "h100"})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status != api.NodeOnline {
			return false
		}
		nodeID = list.Items[0].ID
		devs, err := a.Devices.List(ctx, env.RootKey, api.ListDevices{Node: nodeID})
		return err == nil && len(devs) == 8
	})
	if !strings.Contains(nodeLog.String(), "through the root helper") {
		t.Fatalf("the node does not say it uses the helper:\n%s", nodeLog.String())
	}

	// A reservation's spec, written by root for the node, with the hook of this bcd.
	r, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 2, VCPUs: 4}})
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdiRoot, cdi.SpecName(r.ID))
	eventually(t, "the reservation's CDI spec in root's directory", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID) && strings.Contains(string(b), "cgroup-hook")
	})
	var st syscall.Stat_t
	if err := syscall.Stat(spec, &st); err != nil || st.Uid != 0 {
		t.Fatalf("the spec is owned by uid %d (%v), want root's helper", st.Uid, err)
	}
	if _, err := a.Reservations.Release(ctx, env.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the spec removed", func() bool { holders, _ := cdi.Holders(cdiRoot); return len(holders) == 0 })

	// A MIG slice: made by the helper's MIG.
	devs, err := a.Devices.List(ctx, env.RootKey, api.ListDevices{Node: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Devices.SetMode(ctx, env.RootKey, api.SetGPUMode{Device: devs[7].ID, Mode: api.GPUModeMIG}); err != nil {
		t.Fatal(err)
	}
	r, err = a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{Model: "h100", MIGProfile: "3g.40gb"}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the MIG slice's spec", func() bool {
		b, err := os.ReadFile(filepath.Join(cdiRoot, cdi.SpecName(r.ID)))
		return err == nil && strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES=MIG-fake-7-")
	})
	if !strings.Contains(helperLog.String(), "MIG instance made") {
		t.Fatalf("the helper did not make the MIG instance:\n%s", helperLog.String())
	}

	// gpu.reset, carried out by the helper.
	cmd, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandGPUReset, Args: []byte(`{"gpu": 3}`)})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reset's result", func() bool {
		c, err := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	if !strings.Contains(helperLog.String(), "fake GPU reset") || !strings.Contains(helperLog.String(), "gpu=3") {
		t.Fatalf("the helper did not reset GPU 3:\n%s", helperLog.String())
	}
}
