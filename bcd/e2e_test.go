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
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/computetest"
)

func TestBCDEndToEnd(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{})
	ctx := context.Background()
	a, bin, url := e.API, e.Bin, e.URL
	state, cdiDir := t.TempDir(), t.TempDir()

	// A bad token is refused with the server's reason, and leaves no identity.
	out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", "bcjoin_nope", "--hostname", "gpu-e2e").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "unknown join token") {
		t.Fatalf("join with a bad token: %v\n%s", err, out)
	}
	n := e.node(nodeOptions{Name: "gpu-e2e", State: state, CDIDir: cdiDir, Args: []string{"--fake-command-delay", "5s"}})

	// The node appears with its GPUs.
	nodeID := e.online("gpu-e2e")
	waitStatus(t, bin, state, "the session, running with 8 GPUs", func(st status) bool { return st.Running && st.Connected && st.GPUs == 8 })

	// A reservation makes a CDI spec appear, with the cgroup hook (this bcd) for its vCPUs;
	// its release removes it.
	r, err := a.Reservations.Create(ctx, e.RootKey, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 4, VCPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdiDir, "better-compute-"+r.ID+".json")
	computetest.Eventually(t, e2eWait, "the CDI spec of the reservation", func() bool {
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
	if _, err := a.Reservations.Release(ctx, e.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the CDI spec removed", func() bool {
		holders, _ := cdi.Holders(cdiDir)
		return len(holders) == 0
	})

	// A GPU switched to MIG and a 3g slice of it booked: the spec names the MIG device bcd
	// made (fake hardware's MIG), not the GPU.
	devs, err := a.Devices.List(ctx, e.RootKey, api.ListDevices{Node: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Devices.SetMode(ctx, e.RootKey, api.SetGPUMode{Device: devs[7].ID, Mode: api.GPUModeMIG}); err != nil {
		t.Fatal(err)
	}
	r, err = a.Reservations.Create(ctx, e.RootKey, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{Model: "h100", MIGProfile: "3g.40gb"}})
	if err != nil {
		t.Fatal(err)
	}
	spec = filepath.Join(cdiDir, "better-compute-"+r.ID+".json")
	computetest.Eventually(t, e2eWait, "the CDI spec of the MIG slice", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES=MIG-fake-7-") && !strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES="+devs[7].UUID)
	})
	if _, err := a.Reservations.Release(ctx, e.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the MIG slice's spec removed", func() bool {
		holders, _ := cdi.Holders(cdiDir)
		return len(holders) == 0
	})

	// A command round trip.
	cmd, err := a.Commands.Create(ctx, e.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the health check's result", func() bool {
		c, err := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})

	// kill -9 while a command runs (it takes 5s on the fake hardware), then restart: the result
	// arrives once. The node has the command once it has applied a desired state the gateway sent
	// after it: one stream, sent and read in order. A reservation's CDI spec is that desired state.
	slow, err := a.Commands.Create(ctx, e.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandDiagRun})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the slow command dispatched", func() bool {
		c, _ := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: slow.ID})
		return c.State == api.CommandDispatched
	})
	after, err := a.Reservations.Create(ctx, e.RootKey, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 1}})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the CDI spec of a reservation made after the dispatch", func() bool {
		_, err := os.Stat(filepath.Join(cdiDir, cdi.SpecName(after.ID)))
		return err == nil
	})
	n.kill()
	if c, _ := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: slow.ID}); c.FinishedAt != nil {
		t.Fatalf("the command finished before the kill: %+v", c)
	}
	n.restart()
	var done api.Command
	computetest.Eventually(t, e2eWait, "the interrupted command's result after the restart", func() bool {
		done, _ = a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: slow.ID})
		return done.FinishedAt != nil
	})
	if done.State != api.CommandSucceeded {
		t.Fatalf("after the restart the command is %+v", done)
	}
	e.waitLog("the restarted node saying it ran the interrupted command again", "running again a command a restart interrupted")
	finished := *done.FinishedAt
	// Acknowledged, the result leaves the journal, and it is never recorded again: a command
	// sent after it (one the fake hardware does not slow) comes back, and the first is as it was.
	waitStatus(t, bin, state, "no pending results", func(st status) bool { return st.Running && st.PendingResults == 0 })
	check, err := a.Commands.Create(ctx, e.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandInventoryRefresh})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "an inventory refresh's result after the acknowledgement", func() bool {
		c, err := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: check.ID})
		return err == nil && c.FinishedAt != nil
	})
	again, _ := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: slow.ID})
	if !again.FinishedAt.Equal(finished) {
		t.Fatal("the result was recorded twice")
	}

	// doctor, against the running node (fake hardware: NVML is not checked).
	out, err = exec.Command(bin, "doctor", "--state-dir", state, "--cdi-dir", cdiDir, "--gateway", e.Gateway, "--json", "--config", writeFakeConfig(t)).Output()
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

func TestBCDRefusesBadSetups(t *testing.T) {
	t.Parallel()
	bin := bcdBinary(t)
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
