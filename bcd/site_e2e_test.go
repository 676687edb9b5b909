package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/ramdisk"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/metal/ipmi/ipmisim"
	"github.com/better-compute/compute/metal/siteapi"
)

// machineTree builds the sysfs, procfs and /dev of a one-disk machine with one NIC, as the
// ramdisk reads them, under a temporary Root; its disk /dev/vda is a file of size bytes.
func machineTree(t *testing.T, mac string, size int64) (root, disk string) {
	t.Helper()
	root = t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, rel string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, rel)); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/class/dmi/id/product_serial", "SN-E2E-1\n")
	write("sys/class/dmi/id/sys_vendor", "QEMU\n")
	write("sys/devices/system/cpu/online", "0-3\n")
	write("proc/meminfo", "MemTotal:       4194304 kB\n")
	write("sys/devices/pci0000:00/0000:00:05.0/block/vda/size", strconv.FormatInt(size/512, 10)+"\n")
	write("sys/devices/pci0000:00/0000:00:05.0/block/vda/removable", "0\n")
	link("../devices/pci0000:00/0000:00:05.0/block/vda", "sys/block/vda")
	write("sys/devices/pci0000:00/0000:00:03.0/vendor", "0x1af4\n")
	write("sys/class/net/eth0/address", mac+"\n")
	link(filepath.Join(root, "sys/devices/pci0000:00/0000:00:03.0"), "sys/class/net/eth0/device")
	disk = filepath.Join(root, "dev/vda")
	write("dev/vda", "")
	// What was on the disk before: a deploy wipes it.
	if err := os.WriteFile(disk, bytes.Repeat([]byte{0xee}, int(size)), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, disk
}

// booted is what a ramdisk did last: the kexec it was asked for, or a power-off.
type booted struct {
	mu                      sync.Mutex
	kernel, initrd, cmdline string
	off                     bool
}

// pxeBoot is what a machine's firmware and iPXE do with the site's script (DHCP is off here):
// they fetch it for the machine's MAC, and boot the ramdisk with the command line it gives,
// whose site, boot token and machine id are returned.
func pxeBoot(t *testing.T, siteURL, mac string) (site, machine, token string) {
	t.Helper()
	resp, err := http.Get(siteURL + "/boot/ipxe?mac=" + mac)
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, l := range strings.Split(string(script), "\n") {
		if cmdline, ok := strings.CutPrefix(l, "kernel "+siteURL+"/boot/vmlinuz "); ok {
			site, machine, token, err := ramdisk.ParseCmdline(strings.TrimSuffix(cmdline, " || goto failed"))
			if err != nil {
				t.Fatalf("the script's command line: %v\n%s", err, script)
			}
			return site, machine, token
		}
	}
	t.Fatalf("the script of %s boots no ramdisk:\n%s", mac, script)
	return "", "", ""
}

// runRamdisk runs bcd ramdisk's code for a machine booted from Root with its site's script for
// mac, until it kexecs or powers off (both of which end it, as they end a ramdisk), or the test
// ends.
func runRamdisk(t *testing.T, siteURL, mac, root, chassis string) *booted {
	b := &booted{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	site, machine, token := pxeBoot(t, siteURL, mac)
	cfg := ramdisk.Config{Site: site, Machine: machine, Token: token, Root: root, PollInterval: 200 * time.Millisecond, RetryMax: time.Second,
		Kexec: func(kernel, initrd, cmdline string) error {
			k, _ := os.ReadFile(kernel)
			i, _ := os.ReadFile(initrd)
			b.mu.Lock()
			b.kernel, b.initrd, b.cmdline = string(k), string(i), cmdline
			b.mu.Unlock()
			cancel()
			return nil
		},
		PowerOff: func() error {
			// The machine powers off: its chassis says so to its BMC.
			b.mu.Lock()
			b.off = true
			b.mu.Unlock()
			cancel()
			return os.WriteFile(filepath.Join(chassis, "power.state"), []byte("0\n"), 0o600)
		},
		Reboot: func() error { t.Error("the ramdisk rebooted; no task here asks it to"); cancel(); return nil },
	}
	go func() {
		defer close(done)
		if err := ramdisk.Run(ctx, cfg); err != nil {
			t.Errorf("ramdisk: %v", err)
		}
	}()
	return b
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestASiteAgentCommissionsAndDeploysAMachine runs the metal path with every part real but the
// machine: a control plane with the metal module and a gateway over mutual TLS; the bcd binary
// as a site agent (joined with a site token, serving its site's plan over HTTP, fetching an image
// with its pull token into its cache, carrying out BMC operations against OpenIPMI's ipmi_sim);
// bcd ramdisk's code on a machine whose sysfs and disk are files; and the bcd binary again as the
// deployed system joining its pool. The machine boots unknown and asks to join; it is approved,
// deployed (wiped, streamed, verified, booted), joins as a node, and is released (wiped, off).
func TestASiteAgentCommissionsAndDeploysAMachine(t *testing.T) {
	t.Parallel()
	bmc, chassis := ipmisim.Start(t)
	ctx := context.Background()
	ln := computetest.Listener(t)
	m, err := metal.New(metal.Options{JoinURL: "http://" + ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	e := newE2E(t, e2eOptions{Modules: []compute.Module{m}, Listener: ln})
	bin, url, gw := e.Bin, e.URL, e.Gateway
	c, key := e.Compute, e.RootKey
	for _, call := range []func() error{
		func() error { _, err := c.API.Sites.Create(ctx, key, api.CreateSite{Name: "fra1"}); return err },
		func() error {
			_, err := c.API.Pools.Create(ctx, key, api.CreatePool{Name: "fra1-infra", Site: "fra1"})
			return err
		},
		func() error {
			_, err := c.API.Pools.Create(ctx, key, api.CreatePool{Name: "gpu", Site: "fra1"})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}

	// The image, behind a registry that wants its pull token; its kernel and initramfs.
	img := make([]byte, 3<<20)
	_, _ = rand.Read(img)
	sum := sha256.Sum256(img)
	var imageGets sync.Map
	registry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := imageGets.LoadOrStore(r.URL.Path, new(int))
		*n.(*int)++
		switch {
		case r.URL.Path == "/tiny.raw" && r.Header.Get("Authorization") != "Bearer pull-me":
			http.Error(w, "no", http.StatusUnauthorized)
		case r.URL.Path == "/tiny.raw":
			_, _ = w.Write(img)
		case r.URL.Path == "/vmlinuz" || r.URL.Path == "/initrd":
			_, _ = w.Write([]byte("the deployed system's " + r.URL.Path))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(registry.Close)
	if _, err := compute.Invoke(ctx, c, key, metal.ImagesRegister, metal.RegisterImage{Name: "tiny", URL: registry.URL + "/tiny.raw", Format: "raw",
		SizeBytes: int64(len(img)), SHA256: hex.EncodeToString(sum[:]), KernelURL: registry.URL + "/vmlinuz", InitrdURL: registry.URL + "/initrd",
		Cmdline: "root=/dev/vda console=ttyS0", PullToken: "pull-me"}); err != nil {
		t.Fatal(err)
	}

	// The site agent: bcd join with a site token, then bcd site (HTTP only: DHCP and TFTP are
	// tested in network namespaces by bcd site's own tests).
	jt, err := c.API.JoinTokens.Create(ctx, key, api.CreateJoinToken{Pool: "fra1-infra", Role: api.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	state, dir := t.TempDir(), t.TempDir()
	if out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", jt.Token, "--hostname", "fra1-site-a").CombinedOutput(); err != nil {
		t.Fatalf("bcd join (site token): %v\n%s", err, out)
	}
	for _, f := range []string{"vmlinuz", "initrd"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("the ramdisk's "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	siteURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	site := exec.Command(bin, "site", "--state-dir", state, "--gateway", gw, "--address", "127.0.0.1", "--http", strings.TrimPrefix(siteURL, "http://"),
		"--dhcp", "off", "--tftp", "off", "--kernel", filepath.Join(dir, "vmlinuz"), "--initrd", filepath.Join(dir, "initrd"),
		"--cache-dir", filepath.Join(dir, "cache"), "--fetch-allow", "127.0.0.0/8", "--log-level", "info")
	e.start("bcd site", site)
	computetest.Eventually(t, e2eWait, "the site agent online, with its plan", func() bool {
		var applied bool
		var why string
		err := e.DB.Pool.QueryRow(ctx, `SELECT d.applied_generation = d.generation, d.applied_error FROM compute.node_desired d
			JOIN compute.nodes n ON n.id = d.node_id WHERE n.role = 'site' AND n.status = 'online'`).Scan(&applied, &why)
		if why != "" {
			t.Fatalf("the site agent refused its plan: %s", why)
		}
		return err == nil && applied
	})

	// An unknown machine PXE-boots into the ramdisk: it is a join request, approved.
	const mac = "52:54:00:e2:e0:01"
	root, disk := machineTree(t, mac, 8<<20)
	rd := runRamdisk(t, siteURL, mac, root, chassis)
	var req metal.JoinRequest
	computetest.Eventually(t, e2eWait, "a join request from the machine's ramdisk", func() bool {
		l, err := compute.Invoke(ctx, c, key, metal.JoinRequestsList, metal.ListJoinRequests{State: "pending"})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		req = l.Items[0]
		return true
	})
	if req.Facts.Serial != "SN-E2E-1" || !slices.Equal(req.Facts.MACs, []string{mac}) || len(req.Facts.Disks) != 1 || req.Facts.CPUs != 4 {
		t.Fatalf("the join request's facts are %+v", req.Facts)
	}
	mach, err := compute.Invoke(ctx, c, key, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: req.ID, Name: "rack1-u01",
		BMC: metal.BMCInput{Driver: "ipmi", Address: bmc.Address, Username: ipmisim.Username, Password: ipmisim.Password}})
	if err != nil || mach.Site == "" || !slices.Equal(mach.MACs, []string{mac}) {
		t.Fatalf("approve = %+v, %v", mach, err)
	}

	// The deploy: the same ramdisk learns its machine, and carries out the deploy.
	dr, err := compute.Invoke(ctx, c, key, metal.MachinesDeploy, metal.DeployMachine{Machine: "rack1-u01", Image: "tiny", Pool: "gpu", Disk: "/dev/vda"})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the ramdisk to kexec the deployed system", func() bool {
		run, err := c.API.Workflows.Get(ctx, key, api.GetWorkflow{Run: dr.Run})
		if err != nil || run.State == api.WorkflowFailed {
			t.Fatalf("the deploy: %+v, %v", run, err)
		}
		rd.mu.Lock()
		defer rd.mu.Unlock()
		return rd.cmdline != ""
	})
	got, _ := os.ReadFile(disk)
	if !bytes.Equal(got[:len(img)], img) || !bytes.Equal(got[len(got)-1<<20:], make([]byte, 1<<20)) {
		t.Fatal("the disk does not hold the image, its end wiped")
	}
	// The deployed kernel's command line: the image's, bcd's arguments before it, among them the
	// join credential the site handed to this boot alone (the task did not carry it).
	if p := siteapi.ParseCmdline(rd.cmdline); rd.kernel != "the deployed system's /vmlinuz" || rd.initrd != "the deployed system's /initrd" ||
		!strings.HasSuffix(rd.cmdline, " root=/dev/vda console=ttyS0") || p[siteapi.CmdlineHostname] != "rack1-u01" || !strings.HasPrefix(p[siteapi.CmdlineJoin], metal.DeployPrefix) {
		t.Fatalf("kexec of %q, %q with %q", rd.kernel, rd.initrd, rd.cmdline)
	}
	if n, _ := imageGets.Load("/tiny.raw"); n == nil || *n.(*int) != 1 {
		t.Errorf("the registry served the image %v times, want once: the site fetched it with its token and cached it", n)
	}

	// The deployed system's first boot: bcd join --cmdline, then it is a node of the pool.
	cmdline := filepath.Join(dir, "cmdline")
	if err := os.WriteFile(cmdline, []byte(rd.cmdline+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "join", "--state-dir", t.TempDir(), "--cmdline", cmdline, "--authorized-keys", filepath.Join(dir, "keys")).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "joined as rack1-u01") {
		t.Fatalf("the deployed system's join: %v\n%s", err, out)
	}
	computetest.Eventually(t, e2eWait, "the deploy to succeed", func() bool {
		run, err := c.API.Workflows.Get(ctx, key, api.GetWorkflow{Run: dr.Run})
		if err != nil || run.State == api.WorkflowFailed {
			t.Fatalf("the deploy: %+v, %v", run, err)
		}
		return run.State == api.WorkflowSucceeded
	})
	mach, err = compute.Invoke(ctx, c, key, metal.MachinesGet, metal.MachineRef{Machine: "rack1-u01"})
	if err != nil || mach.State != metal.StateDeployed || mach.NodeID == "" {
		t.Fatalf("after the deploy: %+v, %v", mach, err)
	}
	if log := ipmisim.Log(t, chassis); !slices.Equal(log, []string{"boot pxe", "power 0", "power 1"}) {
		t.Fatalf("the site agent told the chassis %q, want PXE then a cold start", log)
	}

	// The release: the machine PXE-boots into a new ramdisk, which wipes it and powers it off.
	rr, err := compute.Invoke(ctx, c, key, metal.MachinesRelease, metal.MachineRef{Machine: "rack1-u01"})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the site agent to boot the machine into its ramdisk again", func() bool {
		return len(ipmisim.Log(t, chassis)) == 6
	})
	rd = runRamdisk(t, siteURL, mac, root, chassis)
	computetest.Eventually(t, e2eWait, "the release to succeed", func() bool {
		run, err := c.API.Workflows.Get(ctx, key, api.GetWorkflow{Run: rr.Run})
		if err != nil || run.State == api.WorkflowFailed {
			t.Fatalf("the release: %+v, %v", run, err)
		}
		return run.State == api.WorkflowSucceeded
	})
	got, _ = os.ReadFile(disk)
	if !bytes.Equal(got[:1<<20], make([]byte, 1<<20)) || !rd.off {
		t.Fatal("after the release the disk's start is not wiped, or the machine did not power off")
	}
	if mach, err = compute.Invoke(ctx, c, key, metal.MachinesGet, metal.MachineRef{Machine: "rack1-u01"}); err != nil || mach.State != metal.StateAvailable {
		t.Fatalf("after the release: %+v, %v", mach, err)
	}
}
