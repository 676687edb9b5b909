package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/computetest"
)

// agentUID is the unprivileged user the node agent runs as in the helper test (nobody).
const agentUID = 65534

// TestAnUnprivilegedNodeThroughTheRootHelper runs bcd node as nobody (uid 65534) beside bcd
// helper as root, both real processes of the real binary, against a control plane on loopback:
// the node cannot write the runtime's spec directory (root's, 0755), yet a reservation's CDI
// spec appears there and goes with its release, a MIG slice is made by the helper's MIG, and a
// gpu.reset command is carried out by the helper. From the agent's user, bcd helper call is
// refused an unknown command and a directory outside the helper's roots; from another uid,
// everything.
func TestAnUnprivilegedNodeThroughTheRootHelper(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("runs bcd helper as root and bcd node as uid 65534: needs root")
	}
	e := newE2E(t, e2eOptions{})
	ctx := context.Background()
	a, bin := e.API, e.Bin
	// Not t.TempDir(): its parent is 0700, and nobody must reach the node's state (the binary is
	// in a directory every user may walk).
	dir, err := os.MkdirTemp("", "bcd-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
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
	e.start("bcd helper", exec.Command(bin, "helper", "--socket", sock, "--allow-uid", "65534", "--cdi-root", cdiRoot, "--fake-gpus", "8"))
	e.waitLog("the helper serving", "bcd helper: serving")

	call := func(uid int, args ...string) (string, error) {
		out, err := asUser(exec.Command(bin, append([]string{"helper", "call", "--socket", sock}, args...)...), uid).CombinedOutput()
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
	e.waitLog("the helper logging the refused uid", "refused a caller of another uid")

	// The node, as nobody. Without the helper, nobody cannot write the spec directory.
	if err := asUser(exec.Command("/bin/sh", "-c", "touch "+cdiRoot+"/probe"), agentUID).Run(); err == nil {
		t.Fatal("nobody can write the spec directory: the test would prove nothing")
	}
	e.node(nodeOptions{Name: "nobody-node", State: state, CDIDir: cdiRoot, UID: agentUID, Args: []string{"--helper", sock}})
	nodeID := e.online("nobody-node")
	e.waitLog("the node saying it uses the helper", "through the root helper")

	// A reservation's spec, written by root for the node, with the hook of this bcd.
	r, err := a.Reservations.Create(ctx, e.RootKey, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 2, VCPUs: 4}})
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdiRoot, cdi.SpecName(r.ID))
	computetest.Eventually(t, e2eWait, "the reservation's CDI spec in root's directory", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID) && strings.Contains(string(b), "cgroup-hook")
	})
	var st syscall.Stat_t
	if err := syscall.Stat(spec, &st); err != nil || st.Uid != 0 {
		t.Fatalf("the spec is owned by uid %d (%v), want root's helper", st.Uid, err)
	}
	if _, err := a.Reservations.Release(ctx, e.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the spec removed", func() bool { holders, _ := cdi.Holders(cdiRoot); return len(holders) == 0 })

	// A MIG slice: made by the helper's MIG.
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
	computetest.Eventually(t, e2eWait, "the MIG slice's spec", func() bool {
		b, err := os.ReadFile(filepath.Join(cdiRoot, cdi.SpecName(r.ID)))
		return err == nil && strings.Contains(string(b), "NVIDIA_VISIBLE_DEVICES=MIG-fake-7-")
	})
	e.waitLog("the helper making the MIG instance", "MIG instance made")

	// gpu.reset, carried out by the helper.
	cmd, err := a.Commands.Create(ctx, e.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandGPUReset, Args: []byte(`{"gpu": 3}`)})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the reset's result", func() bool {
		c, err := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	e.waitLog("the helper resetting GPU 3", `fake GPU reset" gpu=3`)
}
