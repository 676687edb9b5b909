package emulated_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/initramfs"
	"github.com/better-compute/compute/internal/lib/initramfs/initramfstest"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// In the test binary re-executed inside a test's network namespace: the test it runs there, and
// the bcd binary and ramdisk the parent prepared.
const (
	inNamespace = "BC_EMULATED_NETNS"
	bcdEnv      = "BC_EMULATED_BCD"
	ramdiskEnv  = "BC_EMULATED_RAMDISK"
)

// The test network, inside each test's own namespace: nothing leaves it, and the two tests'
// namespaces do not see each other, so both use the same addresses and ports.
const (
	bridgeAddr = "10.0.0.1" // the control plane, the site agent and the BMC
	apiPort    = "8080"
	gwAddr     = bridgeAddr + ":8443"
	siteHTTP   = bridgeAddr + ":8067"
	bmcAddr    = bridgeAddr + ":623"
	vmBMCPort  = "9002" // ipmi_sim's VM channel, which QEMU's ipmi-bmc-extern dials
	machineMAC = "52:54:00:e2:e0:01"
	serial     = "E2E-0001"
	diskSize   = 96 << 20
	imageSize  = 48 << 20
)

// vmModules are the modules QEMU's machine needs from the ramdisk: its NIC, its disk, and the
// RNG that DHCP waits for. mkramdisk's default set, every common server's drivers, is booted by
// mkramdisk's own TestBootInQEMU; here a ramdisk of 9 MiB rather than 13 boots the machine four
// times, and under TCG iPXE's handling and the kernel's unpacking of the initrd take about a
// second per compressed MiB, and loading the 46 modules of the default set three more.
var vmModules = []string{"virtio_pci", "virtio_net", "virtio_blk", "virtio_rng"}

// TestCommissionAMachineOnEmulatedHardware commissions a machine that exists only as QEMU (TCG,
// q35) and ipmi_sim, with every other part real (a lab: see newLab). The machine is registered
// by its BMC alone, powered on through IPMI, PXE-boots into the ramdisk and asks to join; its
// request carries QEMU's facts and is approved as the machine registered by its BMC. Released,
// it is power-cycled into the ramdisk, wiped, and powered off, which IPMI reads back.
func TestCommissionAMachineOnEmulatedHardware(t *testing.T) { inLab(t, commissionAndRelease) }

// TestDeployAMachineOnEmulatedHardware deploys a machine of a lab (see newLab) registered with
// its BMC and MAC: it is power-cycled into the ramdisk, wiped, the image streamed and verified
// while bcd site is killed and started again, then kexec'd into the deployed system, which
// joins its pool as a node with QEMU's CPUs and memory. Each step is a workflow step; the test
// checks them and the machine's events in order.
//
// The two tests boot the machine twice each (the commission's PXE boot and the release's; the
// deploy's and the kexec): split so, side by side, they take as long as one of them.
func TestDeployAMachineOnEmulatedHardware(t *testing.T) { inLab(t, deploy) }

// inLab runs fn inside a network namespace of its own (a bridge and a tap device for QEMU's
// NIC): the test binary again, under ip netns exec, with the bcd binary and the ramdisk
// prepared once for both tests (and cached for other packages: initramfstest). The two tests
// run side by side: they share nothing but the CPUs. It runs as root only (namespaces, a tap
// device), and skips, saying why, where QEMU, ipmi_sim, iproute2 or Debian's kernel is missing.
func inLab(t *testing.T, fn func(*testing.T, *lab)) {
	if os.Getenv(inNamespace) == t.Name() {
		fn(t, newLab(t))
		return
	}
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: boots QEMU under TCG several times (minutes)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace, a bridge and a tap device")
	}
	for _, bin := range []string{"ip", "qemu-system-x86_64", "ipmi_sim"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (Debian packages iproute2, qemu-system-x86 and openipmi; .ci/run installs them)", bin)
		}
	}
	kv := kernelVersion(t)
	for _, f := range []string{"/dev/net/tun", "/usr/lib/ipxe/qemu/efi-virtio.rom", "/boot/vmlinuz-" + kv} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("%s is missing (Debian packages ipxe-qemu and linux-image-amd64; a tun device): %v", f, err)
		}
	}
	start := time.Now()
	bcd := initramfstest.Build(t, initramfstest.Go{Package: "github.com/better-compute/compute/bcd"})
	ramdisk := initramfstest.Ramdisk(t, initramfs.Options{Init: bcd, KernelVersion: kv, Modules: vmModules})
	t.Logf("TIMING %-40s %6.1fs", "bcd and the ramdisk, built or cached", time.Since(start).Seconds())

	ns := fmt.Sprintf("bce2e%d-%d", os.Getpid(), labs.Add(1))
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	in := func(args ...string) { ip(append([]string{"-n", ns}, args...)...) }
	in("link", "set", "lo", "up")
	in("link", "add", "br0", "type", "bridge")
	in("addr", "add", bridgeAddr+"/24", "dev", "br0")
	in("link", "set", "br0", "up")
	in("tuntap", "add", "dev", "tap0", "mode", "tap")
	in("link", "set", "tap0", "master", "br0")
	in("link", "set", "tap0", "up")

	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.timeout", "10m")
	cmd.Env = append(os.Environ(), inNamespace+"="+t.Name(), bcdEnv+"="+bcd, ramdiskEnv+"="+ramdisk)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		t.Log(sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the test in the namespace: %v", err)
	}
}

// labs numbers the tests' namespaces.
var labs atomic.Int32

// kernelVersion is the kernel the ramdisk boots: the newest Debian kernel installed.
func kernelVersion(t *testing.T) string {
	t.Helper()
	files, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(files) == 0 {
		t.Skip("no kernel under /boot (Debian package linux-image-amd64)")
	}
	slices.Sort(files)
	return strings.TrimPrefix(files[len(files)-1], "/boot/vmlinuz-")
}

// stopwatch records how long each part took, for the docs.
type stopwatch struct {
	t     *testing.T
	start time.Time
	last  time.Time
}

func (s *stopwatch) lap(what string) {
	now := time.Now()
	s.t.Logf("TIMING %-40s %6.1fs (at %6.1fs)", what, now.Sub(s.last).Seconds(), now.Sub(s.start).Seconds())
	s.last = now
}

// lab is one test's world, inside its namespace: a control plane with the metal module (the
// API and the gateway over mutual TLS on every address of the namespace), the sites and pools,
// an image registry on the bridge, the machine (ipmi_sim as its BMC, starting QEMU on power on,
// an empty disk), and bcd site (full DHCP for the lab, iPXE over HTTP, the image cache, BMC
// access) joined with a site token and online. The test follows the control plane's events.
type lab struct {
	ctx                context.Context
	clock              *stopwatch
	env                *computetest.Env
	c                  *compute.Compute
	key                string
	events             *eventLog
	img                []byte // the image the registry serves as node-image
	disk, console, bcd string
	site               *siteProcess
}

func newLab(t *testing.T) *lab {
	l := &lab{ctx: context.Background(), clock: &stopwatch{t: t, start: time.Now(), last: time.Now()}, bcd: os.Getenv(bcdEnv)}
	ctx := l.ctx
	dir := t.TempDir()
	kernel := "/boot/vmlinuz-" + kernelVersion(t)
	ramdisk := os.Getenv(ramdiskEnv)

	// The control plane, on every address of the namespace: the site agent, beside it, joins at
	// loopback; the deployed system at the bridge's address, with the CA pinned.
	ln, err := net.Listen("tcp", ":"+apiPort)
	if err != nil {
		t.Fatal(err)
	}
	m, err := metal.New(metal.Options{JoinURL: "http://" + bridgeAddr + ":" + apiPort})
	if err != nil {
		t.Fatal(err)
	}
	l.env = computetest.New(t, computetest.Options{Modules: []compute.Module{m}, Configure: func(o *compute.Options) {
		o.HeartbeatInterval = time.Second
		o.GatewayAddresses = []string{gwAddr}
		// The lab's image registry is on its private bridge: an operator allows its range.
		o.Outbound.Allow = append(o.Outbound.Allow, netip.MustParsePrefix(bridgeAddr+"/32"))
	}})
	url := l.env.Serve(t, ln)
	l.env.Gateway(t, gwAddr)
	l.c, l.key = l.env.Compute, l.env.RootKey
	l.events = followEvents(t, url, l.key)
	c, key := l.c, l.key
	for _, call := range []func() error{
		func() error { _, err := c.API.Sites.Create(ctx, key, api.CreateSite{Name: "dc1"}); return err },
		func() error {
			_, err := c.API.Pools.Create(ctx, key, api.CreatePool{Name: "infra", Site: "dc1"})
			return err
		},
		func() error {
			_, err := c.API.Pools.Create(ctx, key, api.CreatePool{Name: "gpu", Site: "dc1"})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}

	// The image: random bytes, behind a registry on the bridge, with the kernel and initramfs
	// the deployed system boots (the ramdisk's image doubles as a system that runs bcd node).
	l.img = make([]byte, imageSize)
	_, _ = rand.Read(l.img)
	sum := sha256.Sum256(l.img)
	regLn, err := net.Listen("tcp", bridgeAddr+":0")
	if err != nil {
		t.Fatal(err)
	}
	registry := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/image.raw":
			http.ServeContent(w, r, "image.raw", time.Time{}, bytes.NewReader(l.img))
		case "/vmlinuz":
			http.ServeFile(w, r, kernel)
		case "/initrd":
			http.ServeFile(w, r, ramdisk)
		default:
			http.NotFound(w, r)
		}
	})}
	go func() { _ = registry.Serve(regLn) }()
	t.Cleanup(func() { _ = registry.Close() })
	reg := "http://" + regLn.Addr().String()
	if _, err := compute.Invoke(ctx, c, key, metal.ImagesRegister, metal.RegisterImage{Name: "node-image", URL: reg + "/image.raw", Format: "raw",
		SizeBytes: imageSize, SHA256: hex.EncodeToString(sum[:]), KernelURL: reg + "/vmlinuz", InitrdURL: reg + "/initrd",
		Cmdline: "console=ttyS0 panic=-1 no_timer_check"}); err != nil {
		t.Fatal(err)
	}

	// The machine: ipmi_sim starts QEMU when it is powered on, and stops it when powered off.
	l.disk = filepath.Join(dir, "disk.img")
	if err := os.WriteFile(l.disk, bytes.Repeat([]byte{0x5a}, diskSize), 0o644); err != nil {
		t.Fatal(err)
	}
	l.console = filepath.Join(dir, "console.log")
	startBMC(t, dir, l.disk, l.console)
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(l.console)
			t.Logf("the machine's console:\n%s", tail(b, 200))
		}
	})

	// The site agent, joined with a site token.
	jt, err := c.API.JoinTokens.Create(ctx, key, api.CreateJoinToken{Pool: "infra", Role: api.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "site-state")
	if out, err := exec.Command(l.bcd, "join", "--state-dir", state, "--url", "http://127.0.0.1:"+apiPort, "--token", jt.Token, "--ca-hash", jt.CAHash,
		"--hostname", "dc1-site").CombinedOutput(); err != nil {
		t.Fatalf("bcd join: %v\n%s", err, out)
	}
	l.site = &siteProcess{t: t, args: []string{"site", "--state-dir", state, "--gateway", gwAddr, "--interface", "br0", "--address", bridgeAddr,
		"--http", siteHTTP, "--tftp", "off", "--fetch-allow", bridgeAddr + "/32", "--dhcp", "full", "--dhcp-subnet", "10.0.0.0/24", "--dhcp-range", "10.0.0.100-10.0.0.150",
		"--dhcp-router", bridgeAddr, "--kernel", kernel, "--initrd", ramdisk, "--ramdisk-cmdline", "console=ttyS0 panic=-1 no_timer_check",
		"--cache-dir", filepath.Join(dir, "cache"), "--log-level", "warn"}, bin: l.bcd}
	l.site.start()
	t.Cleanup(l.site.stop)
	l.events.await(t, 30*time.Second, "the site agent online", func(e api.Event) bool { return e.Type == "node.online" })
	l.clock.lap("control plane, BMC and site agent up")
	return l
}

// commissionAndRelease is TestCommissionAMachineOnEmulatedHardware, inside its namespace.
func commissionAndRelease(t *testing.T, l *lab) {
	ctx, c, key := l.ctx, l.c, l.key

	// 1. Registered by its BMC and powered on through IPMI, by the site agent.
	mach, err := compute.Invoke(ctx, c, key, metal.MachinesCreate, metal.CreateMachine{Name: "e2e-0001", Site: "dc1",
		BMC: metal.BMCInput{Driver: "ipmi", Address: bmcAddr, Username: "admin", Password: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := compute.Invoke(ctx, c, key, metal.MachinesPower, metal.PowerMachine{Machine: mach.ID, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	l.runSucceeds(t, pr.Run, 2*time.Minute)
	l.clock.lap("power on through IPMI")

	// 2. It PXE-boots into the ramdisk, which reports it: a join request, approved as the
	// machine registered by its BMC.
	l.events.await(t, 4*time.Minute, "the machine's join request", func(e api.Event) bool { return e.Type == metal.EventJoinRequested })
	l.clock.lap("PXE, iPXE, the ramdisk: a join request")
	list, err := compute.Invoke(ctx, c, key, metal.JoinRequestsList, metal.ListJoinRequests{State: "pending"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("pending join requests: %+v, %v; want the machine's", list.Items, err)
	}
	req := list.Items[0]
	if f := req.Facts; f.Serial != serial || !slices.Equal(f.MACs, []string{machineMAC}) || f.CPUs != 2 || f.MemoryGiB != 1 ||
		len(f.Disks) != 1 || !strings.HasPrefix(f.Disks[0], "vda 96") {
		t.Fatalf("the ramdisk reported %+v, want QEMU's machine (serial %s, MAC %s, 2 CPUs, 1 GiB, vda of 96 MiB)", f, serial, machineMAC)
	}
	approved, err := compute.Invoke(ctx, c, key, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: req.ID, Machine: "e2e-0001"})
	if err != nil {
		t.Fatal(err)
	}
	if approved.ID != mach.ID || approved.State != metal.StateAvailable || approved.Facts.Serial != serial || !slices.Equal(approved.MACs, []string{machineMAC}) {
		t.Fatalf("approved as %+v; want the machine registered by its BMC, available, with QEMU's serial and MAC", approved)
	}

	// 3. The release: power-cycled into the ramdisk, wiped, powered off; IPMI reads it off.
	rr, err := compute.Invoke(ctx, c, key, metal.MachinesRelease, metal.MachineRef{Machine: "e2e-0001"})
	if err != nil {
		t.Fatal(err)
	}
	l.runSucceeds(t, rr.Run, 4*time.Minute)
	l.clock.lap("release: wipe and power off")
	if got, _ := os.ReadFile(l.disk); !bytes.Equal(got[:1<<20], make([]byte, 1<<20)) {
		t.Fatal("after the release the disk's first MiB is not wiped")
	}
	if mach, err = compute.Invoke(ctx, c, key, metal.MachinesGet, metal.MachineRef{Machine: "e2e-0001"}); err != nil || mach.State != metal.StateAvailable || mach.Power != "off" {
		t.Fatalf("after the release: %+v, %v", mach, err)
	}
	if got, want := stepEvents(t, l.env, rr.Run), []string{"plan", "boot-ramdisk", "ramdisk", "wipe", "power-off", "available"}; !slices.Equal(got, want) {
		t.Errorf("the release's steps succeeded in the order %v, want %v", got, want)
	}
	want := []string{metal.EventPower, "metal.task_progress:started", "metal.task_progress:wipe", "metal.task_progress:boot", "metal.machine_released"}
	if got := machineEvents(t, l.env, mach.ID); !isSubsequence(want, got) {
		t.Errorf("the machine's events %v do not hold %v in order", got, want)
	}
}

// deploy is TestDeployAMachineOnEmulatedHardware, inside its namespace.
func deploy(t *testing.T, l *lab) {
	ctx, c, key := l.ctx, l.c, l.key
	mach, err := compute.Invoke(ctx, c, key, metal.MachinesCreate, metal.CreateMachine{Name: "e2e-0001", Site: "dc1", MACs: []string{machineMAC},
		BMC: metal.BMCInput{Driver: "ipmi", Address: bmcAddr, Username: "admin", Password: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}

	// 1. The deploy: the site agent power-cycles it into the ramdisk, which wipes the disk and
	// streams the image; bcd site is killed mid-stream and started again, and the deploy goes on.
	dr, err := compute.Invoke(ctx, c, key, metal.MachinesDeploy, metal.DeployMachine{Machine: "e2e-0001", Image: "node-image", Pool: "gpu", Disk: "/dev/vda"})
	if err != nil {
		t.Fatal(err)
	}
	e := l.events.await(t, 4*time.Minute, "the image streaming", func(e api.Event) bool {
		return e.Subject == mach.ID && e.Type == metal.EventTaskProgress && e.Data["phase"] == "download" || runEnded(e, dr.Run)
	})
	if e.Subject == dr.Run {
		l.runSucceeds(t, dr.Run, 0) // fails, saying why
		t.Fatalf("the deploy ended before the image streamed")
	}
	l.clock.lap("deploy: into the ramdisk, streaming")
	l.site.kill() // no pause: the stream is cut once the process is gone, and the ports are free
	l.site.start()
	l.runSucceeds(t, dr.Run, 5*time.Minute)
	l.clock.lap("deploy: stream, verify, kexec, join")
	// The stream the site's death cut was started again by the ramdisk, from the new site.
	console, _ := os.ReadFile(l.console)
	if !regexp.MustCompile(`streaming the image.*attempt=2`).Match(console) {
		t.Errorf("the ramdisk's console shows no second attempt at the stream: the kill did not cut it\n%s", grepLines(console, "ramdisk:"))
	}
	if got, _ := os.ReadFile(l.disk); !bytes.Equal(got[:imageSize], l.img) {
		t.Fatal("the machine's disk does not hold the image")
	}
	mach, err = compute.Invoke(ctx, c, key, metal.MachinesGet, metal.MachineRef{Machine: "e2e-0001"})
	if err != nil || mach.State != metal.StateDeployed || mach.NodeID == "" {
		t.Fatalf("after the deploy: %+v, %v", mach, err)
	}
	// 2. The deployed system is a node of the pool, with the CPUs and memory QEMU gives it.
	computetest.Eventually(t, time.Minute, "the deployed node's 2 vCPUs in the pool's capacity", func() bool {
		s, err := c.API.Capacity.Summary(ctx, key, api.SummarizeCapacity{Pool: "gpu"})
		return err == nil && s.VCPUs.Total == 2
	})
	node, err := c.API.Nodes.Get(ctx, key, api.GetNode{Node: mach.NodeID})
	if err != nil || node.Name != "e2e-0001" || node.Status != api.NodeOnline || node.Role != api.RoleNode {
		t.Fatalf("the deployed system's node: %+v, %v", node, err)
	}

	// Every step a workflow step, in order; the machine's events in order.
	if got, want := stepEvents(t, l.env, dr.Run), []string{"plan", "boot-ramdisk", "ramdisk", "write", "boot-disk", "join", "ready"}; !slices.Equal(got, want) {
		t.Errorf("the deploy's steps succeeded in the order %v, want %v", got, want)
	}
	want := []string{"metal.machine_seen",
		"metal.task_progress:started", "metal.task_progress:wipe", "metal.task_progress:download", "metal.task_progress:verify",
		"metal.task_progress:boot", "metal.machine_deployed"}
	if got := machineEvents(t, l.env, mach.ID); !isSubsequence(want, got) {
		t.Errorf("the machine's events %v do not hold %v in order", got, want)
	}
}

// startBMC starts ipmi_sim as the machine's BMC on the bridge. Its chassis is a script (its
// chassis_control): power on starts QEMU, power off stops it, the power is whether QEMU runs
// (the guest powering itself off ends QEMU), and the boot device is kept in a file (SeaBIOS boots
// the NIC first whatever it says; iPXE's script sends a machine on to its disk). QEMU's
// ipmi-bmc-extern dials ipmi_sim's VM channel: the guest has a KCS BMC interface.
func startBMC(t *testing.T, dir, disk, consoleLog string) {
	t.Helper()
	vm := fmt.Sprintf(`#!/bin/sh
exec qemu-system-x86_64 -machine q35,accel=tcg -smp 2 -m 1024 -display none -vga none \
  -smbios type=1,serial=%s \
  -chardev file,id=con,path=%s,append=on -serial chardev:con \
  -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=%s,bootindex=1 \
  -device virtio-rng-pci \
  -drive file=%s,if=none,id=d0,format=raw -device virtio-blk-pci,drive=d0 \
  -chardev socket,id=ipmi0,host=127.0.0.1,port=%s,reconnect=1 -device ipmi-bmc-extern,id=bmc0,chardev=ipmi0 -device isa-ipmi-kcs,bmc=bmc0
`, serial, consoleLog, machineMAC, disk, vmBMCPort)
	chassis := `#!/bin/sh
dir=$(dirname "$0")
pidf="$dir/vm.pid"
running() { [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; }
op=$1
shift
case $op in
get)
	for p in "$@"; do
		case $p in
		power) if running; then echo power:1; else echo power:0; fi ;;
		boot) echo "boot:$(cat "$dir/boot.state" 2>/dev/null || echo none)" ;;
		esac
	done ;;
set)
	while [ $# -gt 1 ]; do
		case $1 in
		power)
			if [ "$2" = 1 ]; then
				running || { setsid "$dir/vm.sh" >>"$dir/qemu.log" 2>&1 < /dev/null & echo $! > "$pidf"; }
			elif running; then
				kill "$(cat "$pidf")"; rm -f "$pidf"
			fi ;;
		boot) echo "$2" > "$dir/boot.state" ;;
		esac
		echo "$1 $2" >> "$dir/chassis.log"
		shift 2
	done ;;
esac
`
	host, port, _ := net.SplitHostPort(bmcAddr)
	conf := fmt.Sprintf(`name "e2e"
set_working_mc 0x20
  startlan 1
    addr %s %s
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  serial kcs 127.0.0.1 %s codec VM
  chassis_control "%s"
  user 2 true "admin" "s3cret" admin 10 none md2 md5 straight
`, host, port, vmBMCPort, filepath.Join(dir, "chassis"))
	emu := "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n"
	for name, body := range map[string]string{"vm.sh": vm, "chassis": chassis, "lan.conf": conf, "bmc.emu": emu} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bmc-state"), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", filepath.Join(dir, "bmc-state"), "-n")
	logf, _ := os.Create(filepath.Join(dir, "ipmi_sim.log"))
	cmd.Stdout, cmd.Stderr, cmd.Dir = logf, logf, dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if b, err := os.ReadFile(filepath.Join(dir, "vm.pid")); err == nil { // QEMU runs in its own session
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "ipmi_sim.log"))
			t.Logf("ipmi_sim's output:\n%s", tail(b, 50))
		}
	})
}

// siteProcess is bcd site, which the test kills and starts again.
type siteProcess struct {
	t    *testing.T
	bin  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
}

func (s *siteProcess) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = os.Stderr, os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
}

// kill ends bcd site at once (SIGKILL): no goodbye, nothing flushed.
func (s *siteProcess) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
}

func (s *siteProcess) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		_ = s.cmd.Wait()
	}
}

// runEnded reports whether e is run's end: succeeded, failed or cancelled.
func runEnded(e api.Event, run string) bool {
	return e.Subject == run && (e.Type == "workflow.succeeded" || e.Type == "workflow.failed" || e.Type == "workflow.cancelled")
}

// runSucceeds waits for run to end, and fails the test, saying why, unless it succeeded.
func (l *lab) runSucceeds(t *testing.T, run string, within time.Duration) {
	t.Helper()
	if within > 0 {
		l.events.await(t, within, "run "+run+" to end", func(e api.Event) bool { return runEnded(e, run) })
	}
	r, err := l.c.API.Workflows.Get(l.ctx, l.key, api.GetWorkflow{Run: run})
	if err != nil || r.State != api.WorkflowSucceeded {
		t.Fatalf("run %s (%s) %s at %s: %s (%v)", run, r.Workflow, r.State, r.Step, r.Error, err)
	}
}

// eventLog follows the control plane's event stream for the rest of the test. The test waits on
// what it says: asking the API again and again would take CPU from QEMU, which needs it all.
type eventLog struct {
	mu      sync.Mutex
	seen    []api.Event
	changed chan struct{} // closed when an event arrives or the stream ends, then replaced
	err     error         // why the stream ended
}

func followEvents(t *testing.T, url, key string) *eventLog {
	cl, err := client.New(url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	l := &eventLog{changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := cl.WatchEvents(ctx, client.WatchOptions{}, func(e api.Event) error {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.seen = append(l.seen, e)
			close(l.changed)
			l.changed = make(chan struct{})
			return nil
		})
		l.mu.Lock()
		defer l.mu.Unlock()
		l.err = err
		close(l.changed)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// await waits until an event since the test began matches, and returns it; it fails the test,
// naming what it waited for, after within.
func (l *eventLog) await(t *testing.T, within time.Duration, what string, match func(api.Event) bool) api.Event {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for next := 0; ; {
		l.mu.Lock()
		seen, changed, err := l.seen, l.changed, l.err
		l.mu.Unlock()
		for ; next < len(seen); next++ {
			if match(seen[next]) {
				return seen[next]
			}
		}
		if err != nil {
			t.Fatalf("the event stream ended (%v) while waiting for %s", err, what)
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("not within %s: %s", within, what)
		}
	}
}

// stepEvents are the steps of a run in the order they succeeded.
func stepEvents(t *testing.T, env *computetest.Env, run string) []string {
	t.Helper()
	rows, err := env.DB.Pool.Query(context.Background(), `SELECT data->>'step' FROM compute.events WHERE subject = $1 AND type = 'workflow.step_succeeded' ORDER BY id`, run)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// machineEvents are a machine's events, in order; a task's progress with its phase.
func machineEvents(t *testing.T, env *computetest.Env, machine string) []string {
	t.Helper()
	rows, err := env.DB.Pool.Query(context.Background(), `SELECT type, coalesce(data->>'phase', '') FROM compute.events WHERE subject = $1 ORDER BY id`, machine)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var typ, phase string
		if err := rows.Scan(&typ, &phase); err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			typ += ":" + phase
		}
		out = append(out, typ)
	}
	return out
}

// grepLines is the lines of b that hold s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(ansi.ReplaceAllString(string(b), ""), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// isSubsequence reports whether want appears in got in order (other entries between).
func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]`)

// tail is the last n lines of b, without terminal escapes.
func tail(b []byte, n int) string {
	lines := strings.Split(ansi.ReplaceAllString(string(b), ""), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
