package helper_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/helper"
	"github.com/better-compute/compute/bcd/internal/mig"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// serve runs a helper for the test on a socket in a fresh directory, for uid, with one spec
// root and two fake GPUs, and returns the socket, the root and the fake MIG.
func serve(t *testing.T, uid int) (string, string, *hardware.FakeMIG) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "cdi")
	fm := hardware.NewFakeMIG(2)
	resets := 0
	srv, err := helper.New(helper.Config{AllowUID: uid, CDIRoots: []string{root}, Policy: cdi.SpecPolicy{Hook: "/usr/bin/bcd"}, MIG: fm,
		Reset: func(_ context.Context, gpu int) error {
			if gpu > 1 {
				return errors.New("no such GPU")
			}
			resets++
			return nil
		}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "helper.sock")
	ln, err := helper.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock, root, fm
}

func code(err error) string {
	var he *helper.Error
	if errors.As(err, &he) {
		return he.Code
	}
	return ""
}

// TestTheConvergerWritesThroughTheHelper: a CDI converger whose specs go through the helper
// (as bcd node --helper's do) makes MIG slices and writes, lists and removes its specs in the
// helper's spec directory, the MIG errors keeping their kind across the socket.
func TestTheConvergerWritesThroughTheHelper(t *testing.T) {
	sock, root, fm := serve(t, os.Geteuid())
	c, hello, err := helper.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !hello.MIG || !hello.Reset || !slices.Equal(hello.CDIRoots, []string{root}) || len(hello.Ops) != len(helper.Ops) {
		t.Fatalf("hello = %+v", hello)
	}
	m, err := mig.New(c.MIG(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	devices := func() []*agentv1.GPU {
		return []*agentv1.GPU{{Index: 0, Uuid: "GPU-a"}, {Index: 1, Uuid: "GPU-b"}}
	}
	conv := &cdi.Converger{Dir: root, Specs: c.Specs(root), Devices: devices, MIG: m, Hook: "/usr/bin/bcd", Logger: quiet}
	ds := &agentv1.DesiredState{Generation: 1, Holds: []*agentv1.DeviceHold{
		{Holder: "r1", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-a", Share: -1}}, Cpuset: "0-3", MemoryGib: 8},
		{Holder: "r2", Gpus: []*agentv1.HeldGPU{{Index: 1, Uuid: "GPU-b", MigProfile: "3g.40gb", MigStart: 4, Share: -1}}},
	}, Gpus: []*agentv1.GPUSetting{{Index: 1, Uuid: "GPU-b", Mode: "mig"}}}
	if err := conv.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	holders, err := cdi.Holders(root)
	if err != nil || !slices.Equal(holders, []string{"r1", "r2"}) {
		t.Fatalf("the specs in the helper's directory: %v, %v", holders, err)
	}
	st, err := fm.MIGState(1)
	if err != nil || !st.Enabled || len(st.Instances) != 1 || st.Instances[0].Profile != "3g.40gb" {
		t.Fatalf("the fake GPU 1 after the helper's MIG calls: %+v, %v", st, err)
	}
	var spec cdi.Spec
	b, _ := os.ReadFile(filepath.Join(root, cdi.SpecName("r2")))
	if err := json.Unmarshal(b, &spec); err != nil || !slices.Contains(spec.Devices[0].ContainerEdits.Env, "NVIDIA_VISIBLE_DEVICES="+st.Instances[0].UUID) {
		t.Fatalf("the MIG slice's spec %s (%v) does not name its MIG device %s", b, err, st.Instances[0].UUID)
	}
	// The hold of r1 ends: its spec goes.
	ds.Holds = ds.Holds[1:]
	if err := conv.Apply(context.Background(), ds); err != nil {
		t.Fatal(err)
	}
	if holders, _ := cdi.Holders(root); !slices.Equal(holders, []string{"r2"}) {
		t.Fatalf("after r1's hold ended: %v", holders)
	}
	// A MIG error keeps its kind: the converger branches on it.
	if _, err := c.CreateMIGInstance(1, "9g.99gb", 0); !errors.Is(err, hardware.ErrNoMIGProfile) {
		t.Fatalf("a profile the GPU lacks = %v, want ErrNoMIGProfile", err)
	}
	if err := c.ResetGPU(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ResetGPU(context.Background(), 5); code(err) != helper.CodeFailed {
		t.Fatalf("resetting a GPU the machine lacks = %v, want failed", err)
	}
}

// TestTheHelperRefusesWhatIsNotItsCommands: an unknown command, arguments it does not know, a
// spec directory outside its roots (named directly or by climbing out of one), a file name that
// is not a spec's, a spec bcd would not write, and bad GPU arguments are refused, and nothing is
// written outside the roots.
func TestTheHelperRefusesWhatIsNotItsCommands(t *testing.T) {
	sock, root, _ := serve(t, os.Geteuid())
	c := helper.NewClient(sock)
	defer c.Close()
	ctx := context.Background()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	good, err := json.Marshal(cdi.Spec{CDIVersion: cdi.Version, Kind: cdi.Kind, Devices: []cdi.Device{{Name: "r1",
		ContainerEdits: cdi.ContainerEdits{DeviceNodes: []cdi.DeviceNode{{Path: "/dev/nvidia0"}}, Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	evil := []byte(`{"cdiVersion":"0.6.0","kind":"better-compute.dev/gpu","devices":[{"name":"r1","containerEdits":{"hooks":[{"hookName":"createRuntime","path":"/bin/sh","args":["sh","-c","id"]}]}}],"containerEdits":{}}`)
	for _, bad := range []struct {
		what string
		op   string
		args any
		code string
	}{
		{"an unknown command", "exec", map[string]any{"argv": []string{"/bin/sh"}}, helper.CodeUnknownCommand},
		{"a file write", "file.write", map[string]any{"path": victim, "data": "x"}, helper.CodeUnknownCommand},
		{"an argument cdi.write does not have", helper.OpCDIWrite, map[string]any{"dir": root, "holder": "r1", "spec": json.RawMessage(good), "path": victim}, helper.CodeInvalidArgument},
		{"a directory outside the roots", helper.OpCDIWrite, helper.CDIWrite{Dir: outside, Holder: "r1", Spec: good}, helper.CodeNotAllowed},
		{"climbing out of a root", helper.OpCDIWrite, helper.CDIWrite{Dir: root + "/../../" + filepath.Base(outside), Holder: "r1", Spec: good}, helper.CodeNotAllowed},
		{"a relative directory", helper.OpCDIList, helper.CDIList{Dir: "cdi"}, helper.CodeNotAllowed},
		{"a holder that is a path", helper.OpCDIWrite, helper.CDIWrite{Dir: root, Holder: "../victim", Spec: good}, helper.CodeInvalidArgument},
		{"removing a file that is not a spec", helper.OpCDIRemove, helper.CDIRef{Dir: root, Name: "../victim"}, helper.CodeNotAllowed},
		{"removing outside the roots", helper.OpCDIRemove, helper.CDIRef{Dir: outside, Name: "better-compute-r1.json"}, helper.CodeNotAllowed},
		{"a spec whose hook runs a shell", helper.OpCDIWrite, helper.CDIWrite{Dir: root, Holder: "r1", Spec: evil}, helper.CodeNotAllowed},
		{"a spec of another holder", helper.OpCDIWrite, helper.CDIWrite{Dir: root, Holder: "r2", Spec: good}, helper.CodeNotAllowed},
		{"a GPU index past the bound", helper.OpGPUReset, helper.GPU{GPU: 64}, helper.CodeInvalidArgument},
		{"a MIG profile that is not one", helper.OpMIGCreate, helper.MIGCreate{GPU: 0, Profile: "; rm -rf /", Start: 0}, helper.CodeInvalidArgument},
		{"hello with arguments", helper.OpHello, map[string]any{"x": 1}, helper.CodeInvalidArgument},
	} {
		if err := c.Call(ctx, bad.op, bad.args, nil); code(err) != bad.code {
			t.Errorf("%s: %v, want %s", bad.what, err, bad.code)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("a file outside the roots changed: %q", b)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Fatalf("files appeared outside the roots: %v", entries)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("refused writes left files in the root: %v", entries)
	}
	// The connection still serves after refusals, and the good spec is written.
	if err := c.Call(ctx, helper.OpCDIWrite, helper.CDIWrite{Dir: root, Holder: "r1", Spec: good}, nil); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, cdi.SpecName("r1"))); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("the good spec: %v, %v", fi, err)
	}
}

// TestTheHelperServesOneUID: a process of a uid other than the allowed one is refused before
// any command, by its socket credentials.
func TestTheHelperServesOneUID(t *testing.T) {
	other := os.Geteuid() + 4242
	sock, _, _ := serve(t, other)
	_, _, err := helper.Dial(sock)
	if code(err) != helper.CodeNotAllowed {
		t.Fatalf("a caller of uid %d to a helper for uid %d: %v, want not_allowed", os.Geteuid(), other, err)
	}
}
