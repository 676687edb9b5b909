package chv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps/runtime"
)

// harness is a Runtime whose VMMs are the fake cloud-hypervisor, with a recording Taps, in a
// temporary directory. When the test ends it deletes what is left, and fails the test if a VMM
// outlived its Delete or any request broke the API's contract.
type harness struct {
	t        *testing.T
	base     string // the test's directory
	stateDir string
	kernel   string // a file standing for a kernel: the fake opens it at boot
	taps     *memTaps
	r        *Runtime
	// allowViolations is set by the tests that break the contract on purpose.
	allowViolations bool
}

func newHarness(t *testing.T, edit ...func(*Options)) *harness {
	t.Helper()
	base := t.TempDir()
	h := &harness{t: t, base: base, stateDir: filepath.Join(base, "state"), taps: newMemTaps()}
	h.kernel = filepath.Join(base, "vmlinuz")
	if err := os.WriteFile(h.kernel, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.r = h.newRuntime(edit...)
	t.Cleanup(h.cleanup)
	return h
}

// newRuntime makes another Runtime over the harness's StateDir, as a restarted bcd would.
func (h *harness) newRuntime(edit ...func(*Options)) *Runtime {
	h.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		h.t.Fatal(err)
	}
	o := Options{Binary: exe, StateDir: h.stateDir, Taps: h.taps, StartTimeout: 10 * time.Second, StopTimeout: 3 * time.Second, CallTimeout: 10 * time.Second}
	for _, e := range edit {
		e(&o)
	}
	r, err := New(o)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// instance is a running instance with one NIC, booted from a kernel, its console under base.
func (h *harness) instance(id string) runtime.Instance {
	return runtime.Instance{ID: id, VCPUs: 2, MemoryMiB: 256, Kernel: h.kernel, Cmdline: "console=ttyS0", DiskFormat: runtime.FormatRaw,
		Power: runtime.PowerRunning, Console: filepath.Join(h.base, "consoles", id+".sock"),
		NICs: []runtime.NIC{{MAC: "52:54:00:AB:CD:01", Bridge: "br0", VLAN: 7}}}
}

// fakeFails has the fake cloud-hypervisors this harness starts from now on fail as spec says
// (fakeMain's fake-fail); "" has them behave.
func (h *harness) fakeFails(spec string) { h.fakeFile(fakeFailFile, spec) }

// fakeTaps has the fake cloud-hypervisors this harness starts from now on check their taps.
func (h *harness) fakeTaps() { h.fakeFile(fakeTapsFile, "1") }

func (h *harness) fakeFile(name, content string) {
	h.t.Helper()
	if err := os.MkdirAll(h.stateDir, 0o750); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.stateDir, name), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) ensure(in runtime.Instance, want string) {
	h.t.Helper()
	st, err := h.r.Ensure(context.Background(), in)
	if err != nil || st.State != want || st.ID != in.ID {
		h.t.Fatalf("Ensure %s %s: %+v, %v; want %s", in.ID, in.Power, st, err, want)
	}
}

func (h *harness) cleanup() {
	ctx := context.Background()
	list, err := h.r.List(ctx)
	if err != nil {
		h.t.Errorf("cleanup: List: %v", err)
	}
	for _, st := range list {
		if err := h.r.Delete(ctx, st.ID); err != nil {
			h.t.Errorf("cleanup: Delete %s: %v", st.ID, err)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(h.stateDir, "fake-*.jsonl"))
	for _, l := range logs {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(l), "fake-"), ".jsonl")
		for _, req := range fakeLog(h.t, h.stateDir, name) {
			if req.PID != 0 && !waitGone(req.PID, 5*time.Second) {
				h.t.Errorf("the fake cloud-hypervisor of %s (pid %d) still runs after the test", name, req.PID)
				_ = (&Runtime{opts: Options{StopTimeout: time.Second}}).kill(ctx, req.PID)
			}
			if req.Violation != "" && !h.allowViolations {
				h.t.Errorf("%s: %s %s broke the API's contract: %s (body %s)", name, req.Method, req.Op, req.Violation, req.Body)
			}
		}
	}
}

// stopProcess stops pid (SIGSTOP) and waits until it has: it then answers nothing.
func stopProcess(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 5*time.Second, "pid "+strconv.Itoa(pid)+" stops (T in /proc/<pid>/stat)", func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		i := bytes.LastIndexByte(stat, ')')
		return err == nil && i > 0 && i+2 < len(stat) && stat[i+2] == 'T'
	})
}

// waitGone waits for pid to exit.
func waitGone(pid int, d time.Duration) bool {
	return (&Runtime{}).waitExit(context.Background(), pid, d)
}

// ops are the calls the VM's VMMs answered that change something (not vm.info, vmm.ping), as
// "PUT vm.boot", from the from'th request of its log on; a "start" for each VMM started and a
// "poweroff" for each guest power-off.
func (h *harness) ops(id string, from int) []string {
	var out []string
	for i, r := range fakeLog(h.t, h.stateDir, runtime.Name(id)) {
		switch {
		case i < from:
		case r.Start != nil:
			out = append(out, "start")
		case r.Event != "":
			out = append(out, r.Event)
		case r.Op == "vm.info" || r.Op == "vmm.ping":
		default:
			out = append(out, r.Method+" "+r.Op)
		}
	}
	return out
}

// mark is where the VM's request log ends now, for ops.
func (h *harness) mark(id string) int { return len(fakeLog(h.t, h.stateDir, runtime.Name(id))) }

// vmmPID is the pid of the VM's last VMM (0: none started).
func (h *harness) vmmPID(id string) int {
	pid := 0
	for _, r := range fakeLog(h.t, h.stateDir, runtime.Name(id)) {
		if r.PID != 0 {
			pid = r.PID
		}
	}
	return pid
}

// requests are the VM's requests of one op, in order.
func (h *harness) requests(id, op string) []fakeRequest {
	var out []fakeRequest
	for _, r := range fakeLog(h.t, h.stateDir, runtime.Name(id)) {
		if r.Op == op {
			out = append(out, r)
		}
	}
	return out
}

func (h *harness) expectOps(id string, from int, want ...string) {
	h.t.Helper()
	if got := h.ops(id, from); !slices.Equal(got, want) {
		h.t.Fatalf("%s's VMM was asked %q; want %q", id, got, want)
	}
}

// greets checks that the console socket at path is served by the VM's fake serial console.
func greets(t *testing.T, path, id string) {
	t.Helper()
	conn, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		t.Fatalf("the console %s: %v", path, err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 128)
	n, _ := conn.Read(buf)
	if want := "fake serial console of " + runtime.Name(id); !strings.Contains(string(buf[:n]), want) {
		t.Fatalf("the console %s said %q; want %q", path, buf[:n], want)
	}
}

// memTaps is a Taps in memory that records its calls.
type memTaps struct {
	mu    sync.Mutex
	taps  map[string]Tap
	calls []string
}

func newMemTaps() *memTaps { return &memTaps{taps: map[string]Tap{}} }

func (m *memTaps) Ensure(_ context.Context, t Tap) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.Name == "" || len(t.Name) > 15 || t.Bridge == "" {
		return fmt.Errorf("memTaps: bad tap %+v", t)
	}
	m.calls = append(m.calls, "ensure "+t.Name)
	m.taps[t.Name] = t
	return nil
}

func (m *memTaps) Delete(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, "delete "+name)
	delete(m.taps, name)
	return nil
}

func (m *memTaps) get(name string) (Tap, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.taps[name]
	return t, ok
}

// gone checks that nothing of instance id is left: no directory, no VMM, no taps, no console.
func (h *harness) gone(id, console string) {
	h.t.Helper()
	if _, err := os.Stat(filepath.Join(h.stateDir, runtime.Name(id))); !errors.Is(err, os.ErrNotExist) {
		h.t.Fatalf("%s's directory is still there: %v", id, err)
	}
	if pid := h.vmmPID(id); pid != 0 && !waitGone(pid, 5*time.Second) {
		h.t.Fatalf("%s's VMM (pid %d) still runs", id, pid)
	}
	for i := range maxNICs {
		if _, ok := h.taps.get(tapName(id, i)); ok {
			h.t.Fatalf("%s's tap %s is left", id, tapName(id, i))
		}
	}
	if console != "" {
		if _, err := os.Lstat(console); !errors.Is(err, os.ErrNotExist) {
			h.t.Fatalf("%s's console socket is still there: %v", id, err)
		}
	}
}
