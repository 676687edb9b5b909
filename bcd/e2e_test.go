package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// buildBCD builds the real binary once per test.
func buildBCD(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bcd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build bcd: %v\n%s", err, out)
	}
	return bin
}

type runningNode struct {
	cmd  *exec.Cmd
	done chan error
}

func startNode(t *testing.T, bin string, args ...string) *runningNode {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"node"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &runningNode{cmd: cmd, done: make(chan error, 1)}
	go func() { n.done <- cmd.Wait() }()
	t.Cleanup(func() { n.kill() })
	return n
}

func (n *runningNode) kill() {
	if n.cmd.ProcessState == nil {
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBCDEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bcd binary")
	}
	bin := buildBCD(t)
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
	state, cdiDir := t.TempDir(), t.TempDir()

	// A bad token is refused with the server's reason, and leaves no identity.
	out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", "bcjoin_nope", "--hostname", "gpu-e2e").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown join token") {
		t.Fatalf("join with a bad token: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", "gpu-e2e").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "joined as gpu-e2e") {
		t.Fatalf("join: %v\n%s", err, out)
	}
	nodeArgs := []string{"--state-dir", state, "--cdi-dir", cdiDir, "--gateway", gw, "--fake-gpus", "8", "--fake-command-delay", "5s", "--log-level", "warn"}
	n := startNode(t, bin, nodeArgs...)

	// The node appears with its GPUs.
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
	var st struct {
		NodeName  string `json:"nodeName"`
		Connected bool   `json:"connected"`
		Running   bool   `json:"running"`
		GPUs      int    `json:"gpus"`
	}
	eventually(t, "bcd status --json to show the session", func() bool {
		out, err := exec.Command(bin, "status", "--json", "--state-dir", state).Output()
		return err == nil && json.Unmarshal(out, &st) == nil && st.Running && st.Connected && st.GPUs == 8
	})

	// A reservation makes a CDI spec appear, with the cgroup hook (this bcd) for its vCPUs;
	// its release removes it.
	r, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 4, VCPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdiDir, "better-compute-"+r.ID+".json")
	eventually(t, "the CDI spec of the reservation", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID)
	})
	var s cdi.Spec
	if b, err := os.ReadFile(spec); err != nil || json.Unmarshal(b, &s) != nil {
		t.Fatalf("the spec: %v", err)
	}
	resolved, _ := filepath.EvalSymlinks(bin)
	if h := s.Devices[0].ContainerEdits.Hooks; len(h) != 1 || h[0].Path != resolved || !slices.Contains(h[0].Args, "--cpuset") ||
		!slices.Contains(h[0].Args, r.Allocations[0].CPUSet) {
		t.Fatalf("the spec's hooks %+v (cpuset %q)", h, r.Allocations[0].CPUSet)
	}
	if _, err := a.Reservations.Release(ctx, env.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CDI spec removed", func() bool {
		holders, _ := cdi.Holders(cdiDir)
		return len(holders) == 0
	})

	// A GPU switched to MIG and a 3g slice of it booked: the spec names the MIG device bcd
	// made (fake hardware's MIG), not the GPU.
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
	spec = filepath.Join(cdiDir, "better-compute-"+r.ID+".json")
	eventually(t, "the CDI spec of the MIG slice", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES=MIG-fake-7-") && !strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES="+devs[7].UUID)
	})
	if _, err := a.Reservations.Release(ctx, env.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the MIG slice's spec removed", func() bool {
		holders, _ := cdi.Holders(cdiDir)
		return len(holders) == 0
	})

	// A command round trip.
	cmd, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the health check's result", func() bool {
		c, err := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})

	// kill -9 while a command runs (it takes 5s: room for a loaded machine to see it dispatched
	// and kill it), then restart: the result arrives once.
	slow, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandDiagRun})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slow command dispatched", func() bool {
		c, _ := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: slow.ID})
		return c.State == api.CommandDispatched
	})
	time.Sleep(300 * time.Millisecond)
	n.kill()
	if c, _ := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: slow.ID}); c.FinishedAt != nil {
		t.Fatalf("the command finished before the kill: %+v", c)
	}
	startNode(t, bin, nodeArgs...)
	var done api.Command
	eventually(t, "the interrupted command's result after the restart", func() bool {
		done, _ = a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: slow.ID})
		return done.FinishedAt != nil
	})
	if done.State != api.CommandSucceeded {
		t.Fatalf("after the restart the command is %+v", done)
	}
	finished := *done.FinishedAt
	// Acknowledged, the result leaves the journal, and it is never recorded again.
	eventually(t, "no pending results", func() bool {
		out, err := exec.Command(bin, "status", "--json", "--state-dir", state).Output()
		var s struct {
			PendingResults int `json:"pendingResults"`
		}
		return err == nil && json.Unmarshal(out, &s) == nil && s.PendingResults == 0
	})
	time.Sleep(time.Second)
	again, _ := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: slow.ID})
	if !again.FinishedAt.Equal(finished) {
		t.Fatal("the result was recorded twice")
	}

	// doctor, against the running node (fake hardware: NVML is not checked).
	out, err = exec.Command(bin, "doctor", "--state-dir", state, "--cdi-dir", cdiDir, "--gateway", gw, "--json", "--config", writeFakeConfig(t)).Output()
	var report struct {
		Version int
		OK      bool
		Checks  []struct{ Name, Status, Detail string }
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil || report.Version != 1 || !report.OK {
		t.Fatalf("doctor: %v %v\n%s", err, jerr, out)
	}
	checks := report.Checks
	for _, c := range checks {
		if c.Status == "fail" {
			t.Errorf("doctor: %s failed: %s", c.Name, c.Detail)
		}
	}
	if len(checks) < 5 {
		t.Fatalf("doctor ran %d checks", len(checks))
	}
}

func writeFakeConfig(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(`{"fake": {"gpus": 8}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBCDRefusesBadSetups(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bcd binary")
	}
	bin := buildBCD(t)
	state := t.TempDir()
	// Not joined: node and status say so.
	out, err := exec.Command(bin, "node", "--state-dir", state, "--fake-gpus", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bcd join") {
		t.Fatalf("node before join: %v\n%s", err, out)
	}
	// An unreachable control plane.
	out, err = exec.Command(bin, "join", "--state-dir", t.TempDir(), "--url", "http://127.0.0.1:1", "--token", "bcjoin_x").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cannot reach the control plane") {
		t.Fatalf("join to nowhere: %v\n%s", err, out)
	}
	// A corrupt journal: a clear error, and the file is kept.
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "journal.db"), []byte(strings.Repeat("garbage", 1000)), 0o600)
	out, err = exec.Command(bin, "node", "--state-dir", bad, "--fake-gpus", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "move it aside") {
		t.Fatalf("node with a corrupt journal: %v\n%s", err, out)
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("exit status %v, want 1", err)
	}
}
