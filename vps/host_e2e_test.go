package vps_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/initramfs/initramfstest"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/internal/vmtest"
	"github.com/better-compute/compute/vps/runtime/libvirt"
)

// vmHost is a control plane with the vps module, a real bcd node as its VM host over a private
// session-mode libvirtd, and an image server with the test guest's kernel and initramfs.
type vmHost struct {
	env    *computetest.Env
	ctx    context.Context
	c      *compute.Compute
	key    string
	cl     *client.Client
	h      vmtest.Host
	images string            // the image server's URL
	sums   map[string]string // file → SHA-256
}

func startVMHost(t *testing.T) *vmHost {
	t.Helper()
	if testing.Short() {
		t.Skip("builds bcd and boots VMs")
	}
	h := vmtest.Libvirtd(t)
	kernel, initrd := vmtest.Kernel(t, h), vmtest.Initramfs(t, h)
	bin := buildBCD(t)

	// The images, served as a registry would.
	files := http.NewServeMux()
	sums := map[string]string{}
	for name, path := range map[string]string{"vmlinuz": kernel, "initrd.gz": initrd} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		sums[name] = hex.EncodeToString(s[:])
		files.HandleFunc("/"+name, func(w http.ResponseWriter, _ *http.Request) { w.Write(b) })
	}
	images := httptest.NewServer(files)
	t.Cleanup(images.Close)

	m, err := vps.New(vps.Options{ReconcileEvery: time.Second, SandboxEvery: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's default heartbeat interval: a bcd slowed by the VMs beside it (TCG) must
	// not miss a short grace and go offline.
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
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
	state := filepath.Join(t.TempDir(), "state")
	if out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", "vm-host").CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	node := exec.Command(bin, "node", "--state-dir", state, "--cdi-dir", filepath.Join(state, "cdi"), "--gateway", gw, "--fake-gpus", "1",
		"--vps-runtime", "libvirt", "--vps-fetch-allow", "127.0.0.0/8", "--vps-dir", filepath.Join(h.Dir, "vps"), "--libvirt-socket", h.Socket, "--libvirt-uri", "qemu:///session",
		"--libvirt-domain-type", "qemu", "--libvirt-file-owner", h.Owner(), "--log-level", cmp.Or(os.Getenv("BC_TEST_BCD_LOG"), "warn"))
	node.Stdout, node.Stderr = os.Stderr, os.Stderr
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Process.Kill(); _ = node.Wait() })
	cl, err := client.New(url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	v := &vmHost{env: env, ctx: ctx, c: c, key: key, cl: cl, h: h, images: images.URL, sums: sums}
	if _, err := compute.Invoke(ctx, c, key, vps.VMImagesRegister, vps.RegisterVMImage{Name: "guest",
		Kernel:  &vps.Artifact{URL: images.URL + "/vmlinuz", SHA256: sums["vmlinuz"]},
		Initrd:  &vps.Artifact{URL: images.URL + "/initrd.gz", SHA256: sums["initrd.gz"]},
		Cmdline: "console=ttyS0 quiet no_timer_check"}); err != nil {
		t.Fatal(err)
	}
	// The node is a VM host once its first report is in.
	computetest.Eventually(t, 60*time.Second, "the node is a VM host (its first vps.host report)", func() bool {
		return computetest.Count(t, env.DB.Pool, `SELECT count(*) FROM compute.vps_hosts`) == 1
	})
	return v
}

// buildBCD returns a bcd binary, built once per content for every test binary on the machine
// (initramfstest's cache): static, as the VM tests of other packages build it.
func buildBCD(t *testing.T) string {
	t.Helper()
	return initramfstest.Build(t, initramfstest.Go{Package: "github.com/better-compute/compute/bcd"})
}

// console opens the serial console of an instance or sandbox through ticket.
func (v *vmHost) console(t *testing.T, ticket api.TunnelTicket) *consoleReader {
	t.Helper()
	tun, err := v.cl.OpenTunnel(v.ctx, ticket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Close() })
	return newConsoleReader(v.ctx, tun)
}

// TestInstancesRunOnARealBCDHost: the vps module with a real bcd node as its VM host, over a
// private session-mode libvirtd and real VMs under TCG. An instance is booked and booted from
// images the host fetches and checks; its serial console reaches the guest through a one-use
// ticket and the node's session; it pauses, stops, starts and reboots as asked and its status
// follows; an image whose checksum lies never boots; a delete removes the VM and frees its
// capacity for the next instance.
func TestInstancesRunOnARealBCDHost(t *testing.T) {
	t.Parallel()
	v := startVMHost(t)
	ctx, c, key, h := v.ctx, v.c, v.key, v.h
	flavor, err := compute.Invoke(ctx, c, key, vps.FlavorsCreate, vps.CreateFlavor{Name: "tiny", VCPUs: 1, MemoryGiB: 1})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := compute.Invoke(ctx, c, key, vps.InstancesCreate, vps.CreateInstance{Name: "one", Pool: "vms", Flavor: flavor.Name, Image: "guest",
		UserData: "#cloud-config\nruncmd: [echo seeded]\n"})
	if err != nil {
		t.Fatal(err)
	}
	get := func(id string) vps.Instance {
		t.Helper()
		i, err := compute.Invoke(ctx, c, key, vps.InstancesGet, vps.InstanceRef{Instance: id})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	status := func(id, want string) {
		t.Helper()
		computetest.Eventually(t, 3*time.Minute, "instance "+id+" "+want, func() bool { return get(id).Status == want })
	}
	status(inst.ID, "running")

	console := func() *consoleReader {
		t.Helper()
		ticket, err := compute.Invoke(ctx, c, key, vps.InstancesConsole, vps.InstanceRef{Instance: inst.ID})
		if err != nil {
			t.Fatal(err)
		}
		return v.console(t, ticket)
	}
	// Its NoCloud seed is its second disk, read-only.
	if virsh, err := exec.LookPath("virsh"); err == nil {
		out, err := exec.Command(virsh, "-c", "qemu:///session?socket="+h.Socket, "dumpxml", "bc-"+inst.ID).CombinedOutput()
		if err != nil || !strings.Contains(string(out), filepath.Join(h.Dir, "vps", "seeds", inst.ID+".iso")) || !strings.Contains(string(out), "<readonly/>") {
			t.Fatalf("the domain has no read-only seed disk: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "<rng model='virtio'>") {
			t.Fatalf("the domain gives its guest no entropy (virtio-rng):\n%s", out)
		}
	} else {
		t.Log("virsh (Debian libvirt-clients) is not installed: the seed disk is not read back from libvirt")
	}
	con := console()
	con.expect(t, `bc-guest: (up|tick)`, 3*time.Minute)
	con.tun.Write([]byte("hello from the holder\n"))
	con.expect(t, `hello from the holder`, time.Minute)

	// Paused, stopped and started again; rebooted, it comes up anew.
	for _, step := range []struct {
		m    api.Method[vps.InstanceRef, vps.Instance]
		want string
	}{{vps.InstancesPause, "paused"}, {vps.InstancesStart, "running"}, {vps.InstancesStop, "stopped"}, {vps.InstancesStart, "running"}} {
		if _, err := compute.Invoke(ctx, c, key, step.m, vps.InstanceRef{Instance: inst.ID}); err != nil {
			t.Fatal(err)
		}
		status(inst.ID, step.want)
	}
	con = console()
	con.expect(t, `bc-guest: tick`, 3*time.Minute)
	if _, err := compute.Invoke(ctx, c, key, vps.InstancesReboot, vps.InstanceRef{Instance: inst.ID}); err != nil {
		t.Fatal(err)
	}
	con.expect(t, `bc-guest: up`, 3*time.Minute)

	// An image whose checksum lies: the host refuses it, the instance says why.
	liar, err := compute.Invoke(ctx, c, key, vps.VMImagesRegister, vps.RegisterVMImage{Name: "liar",
		Kernel: &vps.Artifact{URL: v.images + "/vmlinuz", SHA256: strings.Repeat("ab", 32)}})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := compute.Invoke(ctx, c, key, vps.InstancesCreate, vps.CreateInstance{Name: "bad", Pool: "vms", Flavor: flavor.Name, Image: liar.Name})
	if err != nil {
		t.Fatal(err)
	}
	status(bad.ID, "error")
	if d := get(bad.ID).StatusDetail; !strings.Contains(d, "sha256") {
		t.Fatalf("the error of an image that does not match its checksum: %q", d)
	}

	// A GPU flavor: the GPU its reservation holds is passed through by its PCI address (the
	// simulated GPU's; defined stopped, as no GPU can be bound to VFIO here).
	if _, err := compute.Invoke(ctx, c, key, vps.FlavorsCreate, vps.CreateFlavor{Name: "gpu", VCPUs: 1, MemoryGiB: 1, GPUs: 1}); err != nil {
		t.Fatal(err)
	}
	g, err := compute.Invoke(ctx, c, key, vps.InstancesCreate, vps.CreateInstance{Name: "gpu1", Pool: "vms", Flavor: "gpu", Image: "guest", Power: vps.PowerStopped})
	if err != nil {
		t.Fatal(err)
	}
	status(g.ID, "stopped")
	if virsh, err := exec.LookPath("virsh"); err == nil {
		out, err := exec.Command(virsh, "-c", "qemu:///session?socket="+h.Socket, "dumpxml", "bc-"+g.ID).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "<hostdev") || !strings.Contains(string(out), "bus='0x10'") {
			t.Fatalf("the GPU instance's domain passes no GPU through: %v\n%s", err, out)
		}
	}

	// Deleted: the VM goes, and its reservation is released.
	rt, err := libvirt.New(libvirt.Options{Socket: h.Socket, URI: "qemu:///session", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for _, id := range []string{inst.ID, bad.ID, g.ID} {
		if _, err := compute.Invoke(ctx, c, key, vps.InstancesDelete, vps.InstanceRef{Instance: id}); err != nil {
			t.Fatal(err)
		}
	}
	computetest.Eventually(t, time.Minute, "the VMs are deleted", func() bool {
		list, err := rt.List(ctx)
		return err == nil && len(list) == 0
	})
	r, err := c.API.Reservations.Get(ctx, key, api.GetReservation{Reservation: get(inst.ID).ReservationID})
	if err != nil || r.State == api.ReservationActive {
		t.Fatalf("the deleted instance's reservation: %+v, %v", r.State, err)
	}
	if got := get(inst.ID); got.Status != "deleted" || got.DeletedReason != "deleted" {
		t.Fatalf("the deleted instance: %s (%s)", got.Status, got.DeletedReason)
	}
}

// consoleReader collects what a console tunnel says.
type consoleReader struct {
	tun   *client.Tunnel
	lines chan string
}

func newConsoleReader(ctx context.Context, tun *client.Tunnel) *consoleReader {
	c := &consoleReader{tun: tun, lines: make(chan string, 1024)}
	r, w := io.Pipe()
	go func() { _, _ = tun.Wait(ctx, w, nil); w.Close() }()
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c
}

// expect waits for a line matching pattern.
func (c *consoleReader) expect(t *testing.T, pattern string, within time.Duration) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	end := time.After(within)
	var seen []string
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the console ended before %q; it said:\n%s", pattern, strings.Join(seen, "\n"))
			}
			if re.MatchString(l) {
				return
			}
			seen = append(seen, l)
		case <-end:
			t.Fatalf("no %q on the console within %s; it said:\n%s", pattern, within, fmt.Sprint(strings.Join(seen, "\n")))
		}
	}
}
