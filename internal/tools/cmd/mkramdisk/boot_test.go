package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal/siteapi"
)

// The machine QEMU plays, as the test gives it and expects its facts.
const (
	qemuMAC    = "52:54:00:12:34:56"
	qemuSerial = "bcd-qemu-1"
	qemuCPUs   = 2
	qemuMemMiB = 1024 // rounds to 1 GiB in the facts (-m 512 would round to 0)
	diskBytes  = 64 << 20
	mib        = 1 << 20
)

// bootLimit bounds the VM's run, from its start to its power-off: under TCG it takes tens of
// seconds.
const bootLimit = 4 * time.Minute

// TestBootInQEMU builds the ramdisk with mkramdisk (bcd built statically, the default modules
// of Debian's kernel), boots it in QEMU (TCG) with a virtio NIC and disk, and plays the site
// from the host (QEMU's user network reaches it at 10.0.2.2): the ramdisk's Hello must carry
// the machine's facts (the serial, the MAC given to QEMU, 2 CPUs, 1 GiB, the 64 MiB virtio
// disk); it is given a wipe of /dev/vda then a power-off, must post started, wipe and boot, and
// QEMU must exit — the machine powered off — with the disk's first and last MiB zeroed. The
// console is logged when the test fails. It is skipped with -short, or without
// qemu-system-x86_64 or a Debian kernel.
func TestBootInQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the QEMU boot takes tens of seconds, and building bcd more")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (Debian package qemu-system-x86)")
	}
	kernel := testKernel(t)
	vmlinuz := "/boot/vmlinuz-" + kernel
	if f, err := os.Open(vmlinuz); err != nil {
		t.Skipf("kernel %s is not readable (Debian package linux-image-amd64): %v", kernel, err)
	} else {
		f.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // a cold build of bcd, and the boot
	defer cancel()
	dir := t.TempDir()

	// The ramdisk, as an operator builds it.
	start := time.Now()
	rd := filepath.Join(dir, "ramdisk.cpio.gz")
	var out, errs bytes.Buffer
	if err := run(ctx, []string{"-o", rd, "-kernel-version", kernel}, &out, &errs); err != nil {
		t.Fatalf("mkramdisk: %v\n%s", err, errs.String())
	}
	buildTook := time.Since(start)
	t.Logf("mkramdisk (%v):\n%s", buildTook.Round(time.Second), firstLines(out.String(), 3))
	checkInitRefuses(t, rd, dir)

	// The disk: non-zero throughout, so that a wipe shows.
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte{0x5a}, diskBytes), 0o644); err != nil {
		t.Fatal(err)
	}

	site := newQEMUSite(t)
	u, _ := url.Parse(site.srv.URL)
	cmdline := fmt.Sprintf("console=ttyS0 bcd.site=http://10.0.2.2:%s bcd.token=tok-1 panic=-1 no_timer_check", u.Port()) // the boot's token, as a site's script gives it
	vmCtx, vmCancel := context.WithTimeout(ctx, bootLimit)
	defer vmCancel()
	cmd := exec.CommandContext(vmCtx, qemu,
		"-machine", "q35,accel=tcg", "-smp", fmt.Sprint(qemuCPUs), "-m", fmt.Sprint(qemuMemMiB),
		"-nographic", "-vga", "none", "-no-reboot",
		"-smbios", "type=1,serial="+qemuSerial,
		"-kernel", vmlinuz, "-initrd", rd, "-append", cmdline,
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile=,mac="+qemuMAC, // romfile=: no iPXE ROM to start
		// virtio-rng seeds the guest's random number generator, which DHCP waits for: TCG's
		// default CPU has no RDRAND.
		"-device", "virtio-rng-pci",
		"-drive", "file="+disk+",if=virtio,format=raw")
	console := &computetest.Buffer{}
	cmd.Stdout, cmd.Stderr = console, console
	cmd.WaitDelay = 10 * time.Second
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("QEMU console:\n%s", console.String())
		}
	})
	vmStart := time.Now()
	site.start = vmStart
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	vmTook := time.Since(vmStart)
	if vmCtx.Err() != nil {
		t.Fatalf("QEMU did not exit within %v: the machine did not power off (%v)", bootLimit, err)
	}
	if err != nil {
		t.Fatalf("QEMU: %v", err)
	}

	hellos, progress, helloAt, bootAt := site.results()
	t.Logf("timing under TCG: mkramdisk %v; QEMU start → first Hello %v → boot (power-off) posted %v → QEMU exited %v",
		buildTook.Round(time.Second), helloAt.Round(100*time.Millisecond), bootAt.Round(100*time.Millisecond), vmTook.Round(100*time.Millisecond))

	if len(hellos) == 0 {
		t.Fatal("the site received no Hello")
	}
	f := hellos[0].Facts
	if err := f.Validate(); err != nil {
		t.Errorf("the facts do not validate: %v", err)
	}
	want := siteapi.Facts{Serial: qemuSerial, MACs: []string{qemuMAC}, Vendor: "QEMU", Model: f.Model, CPUs: qemuCPUs, MemoryGiB: 1,
		Disks: []string{"vda 64.0M"}}
	if d := cmp.Diff(want, f); d != "" {
		t.Errorf("facts (-want +got):\n%s", d)
	}
	var phases []string
	for _, p := range progress {
		if p.Task != "wipe-1" || p.Machine != "m-qemu" {
			t.Errorf("progress of another task or machine: %+v", p)
		}
		phases = append(phases, p.Phase)
	}
	if d := cmp.Diff([]string{siteapi.PhaseStarted, siteapi.PhaseWipe, siteapi.PhaseBoot}, phases); d != "" {
		t.Errorf("progress phases (-want +got):\n%s", d)
	}

	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != diskBytes {
		t.Errorf("the disk image is %d bytes, want %d", len(b), diskBytes)
	}
	zero := make([]byte, mib)
	if !bytes.Equal(b[:mib], zero) {
		t.Error("the disk's first MiB is not zeroed")
	}
	if !bytes.Equal(b[len(b)-mib:], zero) {
		t.Error("the disk's last MiB is not zeroed")
	}
	con := console.String()
	for _, s := range []string{"bcd init: kernel modules loaded", "failed=0", "bcd init: network configured", "address=10.0.2.15/24",
		"ramdisk: machine inspected", "reboot: Power down"} {
		if !strings.Contains(con, s) {
			t.Errorf("the console does not say %q", s)
		}
	}
}

// checkInitRefuses takes /init out of the ramdisk and runs it as bcd init, not as PID 1: it is
// a working static bcd, and refuses.
func checkInitRefuses(t *testing.T, rd, dir string) {
	t.Helper()
	gz, err := os.ReadFile(rd)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Name != "init" {
			continue
		}
		bin := filepath.Join(dir, "bcd")
		data, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "init").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "init runs only as PID 1") {
			t.Errorf("bcd init, not as PID 1: %v, %q; want a refusal", err, out)
		}
		return
	}
	t.Fatal("the ramdisk has no /init")
}

// qemuSite plays the site agent's ramdisk API: it records the Hellos and progress, names the
// machine m-qemu with token tok-1, and gives it one task, a wipe of /dev/vda then a power-off.
type qemuSite struct {
	srv      *httptest.Server
	mu       sync.Mutex
	start    time.Time
	hellos   []siteapi.Hello
	progress []siteapi.Progress
	helloAt  time.Duration
	bootAt   time.Duration
	given    bool
}

func newQEMUSite(t *testing.T) *qemuSite {
	s := &qemuSite{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+siteapi.PathHello, func(w http.ResponseWriter, r *http.Request) {
		var h siteapi.Hello
		if r.Header.Get("Authorization") != "Bearer tok-1" {
			http.Error(w, "not the boot's token", http.StatusUnauthorized)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&h); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.hellos = append(s.hellos, h)
		if s.helloAt == 0 {
			s.helloAt = time.Since(s.start)
		}
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(siteapi.HelloAnswer{Machine: "m-qemu"})
	})
	mux.HandleFunc("GET "+siteapi.PathTask, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-1" || r.URL.Query().Get("machine") != "m-qemu" {
			http.Error(w, "not this machine's token", http.StatusUnauthorized)
			return
		}
		s.mu.Lock()
		given := s.given
		s.given = true
		s.mu.Unlock()
		if given {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_ = json.NewEncoder(w).Encode(siteapi.Task{ID: "wipe-1", Kind: siteapi.TaskWipe, Disk: "/dev/vda", Then: siteapi.ThenPowerOff})
	})
	mux.HandleFunc("POST "+siteapi.PathProgress, func(w http.ResponseWriter, r *http.Request) {
		var p siteapi.Progress
		if r.Header.Get("Authorization") != "Bearer tok-1" {
			http.Error(w, "not this machine's token", http.StatusUnauthorized)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Validate() != nil {
			http.Error(w, "bad progress", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.progress = append(s.progress, p)
		if p.Phase == siteapi.PhaseBoot && s.bootAt == 0 {
			s.bootAt = time.Since(s.start)
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *qemuSite) results() ([]siteapi.Hello, []siteapi.Progress, time.Duration, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]siteapi.Hello(nil), s.hellos...), append([]siteapi.Progress(nil), s.progress...), s.helloAt, s.bootAt
}

// testKernel is the Debian kernel the test boots: $BCD_TEST_KERNEL, or the only one under
// /lib/modules. The test is skipped without one.
func testKernel(t *testing.T) string {
	t.Helper()
	if v := os.Getenv("BCD_TEST_KERNEL"); v != "" {
		return v
	}
	k, err := defaultKernel("/lib/modules")
	if err != nil {
		t.Skipf("no kernel to boot: %v", err)
	}
	return k
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
