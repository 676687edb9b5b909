package hostagent_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/vps/hostagent"
	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/internal/vmtest"
	"github.com/better-compute/compute/vps/runtime/libvirt"
)

// report is one report an agent sent.
type report struct {
	kind    string
	payload []byte
}

// reports records an agent's reports, in order, as the control plane would receive them.
type reports chan report

func (r reports) Report(ctx context.Context, kind string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	select {
	case r <- report{kind, b}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next is the agent's next report.
func (r reports) next(t *testing.T) report {
	t.Helper()
	select {
	case rep := <-r:
		return rep
	case <-time.After(30 * time.Second):
		t.Fatal("no report from the agent in 30 s")
		return report{}
	}
}

// host reads a vps.host report, failing the test on another kind.
func (rep report) host(t *testing.T) hostapi.Host {
	t.Helper()
	var h hostapi.Host
	if rep.kind != hostapi.KindHost {
		t.Fatalf("a %s report (%s), want %s", rep.kind, rep.payload, hostapi.KindHost)
	}
	if err := json.Unmarshal(rep.payload, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

// startAgent runs a host agent over a libvirt runtime that dials sock.
func startAgent(t *testing.T, sock string) (*hostagent.Agent, reports) {
	t.Helper()
	dir := t.TempDir()
	rt, err := libvirt.New(libvirt.Options{Socket: sock, URI: "qemu:///session", DomainType: "qemu", StateDir: filepath.Join(dir, "instances"),
		Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	rep := make(reports, 64)
	a, err := hostagent.New(hostagent.Options{Runtime: rt, Dir: filepath.Join(dir, "vps"), Reporter: rep, StatusEvery: time.Hour,
		RetryEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return a, rep
}

// TestUnreachableRuntimeIsReported: a host whose libvirtd does not answer (no socket at its
// path, or a socket nobody listens on: real conditions, not a fake runtime) says so in its
// vps.host report, naming why; a convergence fails naming the runtime. Once a libvirtd answers at that path, the host reports its runtime
// reachable, then its instances.
func TestUnreachableRuntimeIsReported(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		make func(t *testing.T, sock string)
	}{
		{"no socket", func(*testing.T, string) {}},
		{"nobody listens", func(t *testing.T, sock string) {
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false) // the file stays, refusing connections
			ln.Close()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sock := filepath.Join(t.TempDir(), "libvirt-sock")
			c.make(t, sock)
			a, rep := startAgent(t, sock)
			h := rep.next(t).host(t)
			if h.Runtime != "libvirt-kvm" || !strings.Contains(h.Unreachable, sock) {
				t.Fatalf("the first report of a host whose libvirtd does not answer: %+v", h)
			}
			err := a.Extension().Desired[hostapi.KindInstances](context.Background(), hostapi.InstancesVersion, []byte(`{"instances": []}`))
			if err == nil || !strings.Contains(err.Error(), sock) {
				t.Fatalf("a convergence with the runtime down: %v", err)
			}
		})
	}

	t.Run("comes back", func(t *testing.T) {
		t.Parallel()
		sock := filepath.Join(t.TempDir(), "libvirt-sock")
		_, rep := startAgent(t, sock)
		if h := rep.next(t).host(t); h.Unreachable == "" {
			t.Fatalf("a host with no libvirtd said it reached it: %+v", h)
		}
		lv := vmtest.Libvirtd(t)
		if err := os.Symlink(lv.Socket, sock); err != nil {
			t.Fatal(err)
		}
		if h := rep.next(t).host(t); h.Unreachable != "" || h.Runtime != "libvirt-kvm" {
			t.Fatalf("once libvirtd answers: %+v", h)
		}
		st := rep.next(t)
		if st.kind != hostapi.KindStatus || string(st.payload) != `{"instances":[]}` {
			t.Fatalf("after the runtime came back: %s %s", st.kind, st.payload)
		}
	})
}
