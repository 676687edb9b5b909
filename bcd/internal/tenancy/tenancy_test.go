package tenancy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/compute/bcd/internal/tenancy/tenancytest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

// TestHoldersAreConfinedOnTheMachine: on this machine, as root, the Manager makes each hold's
// user and home, gives each its own GPUs' device nodes alone, runs a command as it, and removes
// an ended hold's user, processes and home. (The node's whole path, with two tenants, SSH and
// the control plane, is bcd's TestTenantsSharingANodeAreConfined.)
func TestHoldersAreConfinedOnTheMachine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the Manager makes users and changes device nodes' owners")
	}
	tenancytest.LockHostUsers(t)
	for _, tool := range append(slices.Clone(tools), "mount") {
		if _, err := lookTool(tool); err != nil {
			t.Skipf("%s is not installed (Debian packages passwd, util-linux)", tool)
		}
	}
	base, err := os.MkdirTemp("", "tenancy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	home, dev, cdiDir := filepath.Join(base, "home"), filepath.Join(base, "dev"), filepath.Join(base, "cdi")
	for _, d := range []string{dev, cdiDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// GPUs 90 to 93 (names no other test of this machine uses: their groups are global).
	for i := 90; i < 94; i++ {
		p := filepath.Join(dev, fmt.Sprintf("nvidia%d", i))
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = exec.Command("groupdel", deviceGroup(p)).Run() })
	}
	id := func() string {
		b := make([]byte, 8)
		rand.Read(b)
		return "0190" + hex.EncodeToString(b)
	}
	r1, r2 := id(), id()
	t.Cleanup(func() {
		for _, r := range []string{r1, r2} {
			_ = exec.Command("userdel", api.ReservationUser(r)).Run()
		}
	})
	spec := func(holder string, gpus ...int) {
		s := cdi.Spec{CDIVersion: cdi.Version, Kind: cdi.Kind, Devices: []cdi.Device{{Name: holder}}}
		for _, g := range gpus {
			s.Devices[0].ContainerEdits.DeviceNodes = append(s.Devices[0].ContainerEdits.DeviceNodes, cdi.DeviceNode{Path: fmt.Sprintf("%s/nvidia%d", dev, g)})
		}
		s.Devices[0].ContainerEdits.Env = []string{"NVIDIA_VISIBLE_DEVICES=GPU-" + holder}
		b, _ := json.Marshal(s)
		if err := os.WriteFile(filepath.Join(cdiDir, cdi.SpecName(holder)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec(r1, 90, 91)
	spec(r2, 92)
	m, err := New(Options{StateDir: base, Home: home, DeviceRoot: dev, CDIDir: cdiDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	both := &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: r1}, {Holder: r2}}}
	if err := m.Apply(ctx, both); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, both); err != nil { // again: it converges, changes nothing
		t.Fatal(err)
	}
	run := func(res, script string) (string, error) {
		cmd := exec.Command("sh", "-c", script)
		started, err := m.Confine(res, cmd)
		if err != nil {
			return "", err
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Start()
		started()
		if err == nil {
			err = cmd.Wait()
		}
		return out.String(), err
	}
	probe := fmt.Sprintf(`id -un; pwd; echo $CUDA_VISIBLE_DEVICES; for i in 90 91 92 93; do if (: < %s/nvidia$i) 2>/dev/null; then echo $i; fi; done`, dev)
	for _, c := range []struct {
		res  string
		gpus []string
	}{{r1, []string{"90", "91"}}, {r2, []string{"92"}}} {
		out, err := run(c.res, probe)
		f := strings.Fields(out)
		want := append([]string{api.ReservationUser(c.res), filepath.Join(home, api.ReservationUser(c.res)), "GPU-" + c.res}, c.gpus...)
		if err != nil || !slices.Equal(f, want) {
			t.Fatalf("reservation %s's command: %v\n%s\nwant %v", c.res, err, out, want)
		}
	}
	if _, err := run("not-a-holder", "true"); err == nil {
		t.Fatal("a command of a reservation the node does not hold ran")
	}

	// What r2 could leave to keep its GPU: a setgid file of nvidia92's group (made here by root
	// as r2 would), and an open descriptor of nvidia92 passed to a process of another uid (r1's).
	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(dev, "nvidia92"), &before); err != nil {
		t.Fatal(err)
	}
	r2UID := m.state.Users[r2].UID
	node92, err := os.Open(filepath.Join(dev, "nvidia92"))
	if err != nil {
		t.Fatal(err)
	}
	passed := exec.Command("sleep", "300")
	passed.ExtraFiles = []*os.File{node92}
	passed.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(m.state.Users[r1].UID), Gid: uint32(m.state.Users[r1].GID)}}
	if err := passed.Start(); err != nil {
		t.Fatal(err)
	}
	node92.Close()
	passedDone := make(chan error, 1)
	go func() { passedDone <- passed.Wait() }()
	t.Cleanup(func() { _ = passed.Process.Kill() })

	// r2 ends: its process is killed, its home and user removed; r1 keeps its own.
	sleeper := exec.Command("sleep", "300")
	started, err := m.Confine(r2, sleeper)
	if err != nil {
		t.Fatal(err)
	}
	err = sleeper.Start()
	started()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	if err := m.Apply(ctx, &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: r1}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("the ended hold's process exited by itself")
	}
	if _, err := user.Lookup(api.ReservationUser(r2)); err == nil {
		t.Fatal("the ended hold's user is still there")
	}
	if _, err := os.Stat(filepath.Join(home, api.ReservationUser(r2))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the ended hold's home: %v", err)
	}
	if out, err := run(r1, probe); err != nil || !strings.HasSuffix(strings.TrimSpace(out), "90\n91") {
		t.Fatalf("r1 after r2 ended: %v\n%s", err, out)
	}
	// Nothing r2 left reaches nvidia92 now: the process holding it open under another uid is
	// killed, and a new hold of it has a group (and its user a uid) that were never r2's.
	select {
	case <-passedDone:
	case <-time.After(10 * time.Second):
		t.Fatal("a process of another uid holding the ended hold's GPU open still runs")
	}
	r3 := id()
	t.Cleanup(func() { _ = exec.Command("userdel", api.ReservationUser(r3)).Run() })
	spec(r3, 92)
	if err := m.Apply(ctx, &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: r1}, {Holder: r3}}}); err != nil {
		t.Fatal(err)
	}
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(dev, "nvidia92"), &after); err != nil {
		t.Fatal(err)
	}
	if after.Gid == before.Gid {
		t.Fatalf("nvidia92's group kept gid %d from r2's hold to r3's: a setgid file r2 left would open it", after.Gid)
	}
	if got := m.state.Users[r3].UID; got == r2UID {
		t.Fatalf("r3's user was given r2's uid %d: what r2 left would be r3's", got)
	}
	if out, err := run(r3, probe); err != nil || !strings.HasSuffix(strings.TrimSpace(out), "92") {
		t.Fatalf("r3's command: %v\n%s", err, out)
	}
	// A Manager started again knows what it made, and removes it.
	m, err = New(Options{StateDir: base, Home: home, DeviceRoot: dev, CDIDir: cdiDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(ctx, &agentv1.DesiredState{}); err != nil {
		t.Fatal(err)
	}
	if _, err := user.Lookup(api.ReservationUser(r3)); err == nil {
		t.Fatal("a hold's user outlived every hold")
	}
	if _, err := user.Lookup(api.ReservationUser(r1)); err == nil {
		t.Fatal("a hold's user outlived every hold")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dev, "nvidia90"), &st); err != nil || st.Mode&0o777 != 0o660 {
		t.Fatalf("an unheld GPU's node: mode %o, %v", st.Mode&0o777, err)
	}
}

// TestAHoldEndingWhileItsCommandStartsKillsIt: the hold ends (Apply removes its user) between
// Confine and the command's start. Apply waits for the start, so the command is one of the
// user's processes it kills; else it would start as the removed user's uid, with its GPUs'
// groups, and outlive the hold.
func TestAHoldEndingWhileItsCommandStartsKillsIt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the Manager makes users")
	}
	tenancytest.LockHostUsers(t)
	for _, tool := range tools {
		if _, err := lookTool(tool); err != nil {
			t.Skipf("%s is not installed (Debian package passwd)", tool)
		}
	}
	base, err := os.MkdirTemp("", "tenancy-") // not t.TempDir: its parent is root's alone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(base, "cdi")
	if err := os.Mkdir(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 8)
	rand.Read(b)
	res := "0190" + hex.EncodeToString(b)
	t.Cleanup(func() { _ = exec.Command("userdel", api.ReservationUser(res)).Run() })
	m, err := New(Options{StateDir: base, Home: filepath.Join(base, "home"), DeviceRoot: filepath.Join(base, "dev"), CDIDir: cdiDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.Apply(ctx, &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: res}}}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	started, err := m.Confine(res, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if m.mu.TryLock() {
		m.mu.Unlock()
		started()
		t.Fatal("Apply may remove the hold's user between Confine and its command's start")
	}
	applied := make(chan error, 1)
	go func() { applied <- m.Apply(ctx, &agentv1.DesiredState{}) }()
	err = cmd.Start()
	started()
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1) // reaped as bcd reaps its commands: a zombie is a process of the uid still
	go func() { waited <- cmd.Wait() }()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err == nil {
		t.Fatal("the ended hold's command exited by itself")
	}
}
