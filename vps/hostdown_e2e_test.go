package vps_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/internal/vmtest"
)

// TestUnreachableRuntimeOnARealBCDHost: a real bcd node --vps-runtime libvirt whose libvirtd
// is not running (nothing at its socket's path) is a VM host the control plane sees cannot
// reach its runtime (vmhost.runtime_down, naming the socket): an instance is refused, naming
// the host, and books nothing. Once a libvirtd answers at that path (a private one, where
// libvirtd is installed), the host says so (vmhost.runtime_up) and takes instances again: one
// is defined there, stopped, as asked.
func TestUnreachableRuntimeOnARealBCDHost(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds bcd")
	}
	bin := buildBCD(t)
	kernel := []byte("not a kernel: the instance is only defined, stopped")
	sum := sha256.Sum256(kernel)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(kernel) }))
	t.Cleanup(images.Close)

	m, err := vps.New(vps.Options{ReconcileEvery: time.Second, SandboxEvery: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's default heartbeat interval: a bcd slowed by the VMs beside it (TCG) must
	// not miss a short grace and go offline.
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	c, key := env.Compute, env.RootKey
	if _, err := c.API.Pools.Create(ctx, key, api.CreatePool{Name: "vms"}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.API.JoinTokens.Create(ctx, key, api.CreateJoinToken{Pool: "vms"})
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir(): its parent is 0700, and a libvirtd started later runs as another user.
	dir, err := os.MkdirTemp("", "vmdown-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "libvirt-sock") // nothing listens here
	owner := os.Geteuid()
	if owner == 0 {
		owner = vmtest.Unprivileged // vmtest's libvirtd runs as this user when the test is root
	}
	state := filepath.Join(t.TempDir(), "state")
	if out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", "vm-host").CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	node := exec.Command(bin, "node", "--state-dir", state, "--cdi-dir", filepath.Join(state, "cdi"), "--gateway", gw, "--fake-gpus", "1",
		"--vps-runtime", "libvirt", "--vps-fetch-allow", "127.0.0.0/8", "--vps-dir", filepath.Join(dir, "vps"), "--libvirt-socket", sock, "--libvirt-uri", "qemu:///session",
		"--libvirt-domain-type", "qemu", "--libvirt-file-owner", strconv.Itoa(owner)+":"+strconv.Itoa(owner), "--log-level", "warn")
	node.Stdout, node.Stderr = os.Stderr, os.Stderr
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Process.Kill(); _ = node.Wait() })

	nodeID := func() string {
		p, err := c.API.Nodes.List(ctx, key, api.ListNodes{})
		if err != nil || len(p.Items) != 1 {
			t.Fatalf("the nodes: %+v %v", p.Items, err)
		}
		return p.Items[0].ID
	}()
	hostEvent := func(typ string, ok func(map[string]any) bool) bool {
		evs, err := c.API.Events.List(ctx, key, api.ListEvents{Subject: nodeID, Type: typ})
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(evs.Items, func(e api.Event) bool { return ok(e.Data) })
	}
	computetest.Eventually(t, time.Minute, "vmhost.runtime_down naming the socket", func() bool {
		return hostEvent(vps.EventVMHostRuntimeDown, func(d map[string]any) bool {
			detail, _ := d["detail"].(string)
			return d["runtime"] == "libvirt-kvm" && strings.Contains(detail, sock)
		})
	})

	if _, err := compute.Invoke(ctx, c, key, vps.FlavorsCreate, vps.CreateFlavor{Name: "tiny", VCPUs: 1, MemoryGiB: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(ctx, c, key, vps.VMImagesRegister, vps.RegisterVMImage{Name: "blob",
		Kernel: &vps.Artifact{URL: images.URL + "/vmlinuz", SHA256: hex.EncodeToString(sum[:])}}); err != nil {
		t.Fatal(err)
	}
	create := func() (vps.Instance, error) {
		return compute.Invoke(ctx, c, key, vps.InstancesCreate, vps.CreateInstance{Name: "one", Pool: "vms", Flavor: "tiny", Image: "blob",
			Power: vps.PowerStopped})
	}
	_, err = create()
	var e *api.Error
	if api.CodeOf(err) != api.CodeConflict || !errors.As(err, &e) || e.Details["reason"] != "vm_host_unreachable" || !strings.Contains(e.Message, "vm-host") {
		t.Fatalf("an instance on a pool whose one VM host cannot reach its runtime: %v", err)
	}
	if p, err := c.API.Reservations.List(ctx, key, api.ListReservations{State: api.ReservationActive}); err != nil || len(p.Items) != 0 {
		t.Fatalf("active reservations after the refusal: %+v %v", p.Items, err)
	}

	t.Run("comes back", func(t *testing.T) {
		h := vmtest.Libvirtd(t) // skips where libvirtd is not installed
		if err := os.Symlink(h.Socket, sock); err != nil {
			t.Fatal(err)
		}
		computetest.Eventually(t, time.Minute, "vmhost.runtime_up", func() bool {
			return hostEvent(vps.EventVMHostRuntimeUp, func(map[string]any) bool { return true })
		})
		inst, err := create()
		if err != nil {
			t.Fatalf("an instance once the host reaches its runtime: %v", err)
		}
		computetest.Eventually(t, 2*time.Minute, "the instance is defined, stopped", func() bool {
			got, err := compute.Invoke(ctx, c, key, vps.InstancesGet, vps.InstanceRef{Instance: inst.ID})
			if err != nil {
				t.Fatal(err)
			}
			return got.Status == "stopped"
		})
	})
}
