package site

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// Files the test sites serve: stand-ins for Debian's iPXE binaries and a ramdisk, with content
// a test can recognise.
var (
	biosBytes   = bytes.Repeat([]byte("undionly.kpxe "), 300) // several TFTP blocks
	efiBytes    = bytes.Repeat([]byte("snponly.efi "), 100)
	ipxeEFI     = bytes.Repeat([]byte("ipxe.efi "), 100)
	kernelBytes = bytes.Repeat([]byte("vmlinuz "), 1000)
	initrdBytes = bytes.Repeat([]byte("initrd "), 1000)
)

// fixture writes an iPXE directory and a ramdisk under dir and returns a config serving them on
// loopback, DHCP off, reporting to up.
func fixture(t testing.TB, dir string, up Upstream) Config {
	t.Helper()
	ipxe := filepath.Join(dir, "ipxe")
	must(t, os.MkdirAll(ipxe, 0o755))
	must(t, os.WriteFile(filepath.Join(ipxe, BIOSBinary), biosBytes, 0o644))
	must(t, os.WriteFile(filepath.Join(ipxe, EFIBinarySNP), efiBytes, 0o644))
	must(t, os.WriteFile(filepath.Join(ipxe, EFIBinaryIPXE), ipxeEFI, 0o644))
	must(t, os.WriteFile(filepath.Join(ipxe, "secret.txt"), []byte("not an iPXE binary"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "vmlinuz"), kernelBytes, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "initrd"), initrdBytes, 0o644))
	return fixtureConfig(dir, up)
}

// fixtureConfig is the config of the files fixture wrote under dir.
func fixtureConfig(dir string, up Upstream) Config {
	return Config{
		Address:  netip.MustParseAddr("127.0.0.1"),
		HTTPAddr: "127.0.0.1:0",
		TFTPAddr: "127.0.0.1:0",
		DHCP:     DHCPConfig{Mode: DHCPOff},
		IPXEDir:  filepath.Join(dir, "ipxe"),
		Kernel:   filepath.Join(dir, "vmlinuz"),
		Initrd:   filepath.Join(dir, "initrd"),
		Cmdline:  "console=ttyS0,115200",
		CacheDir: filepath.Join(dir, "cache"),
		StateDir: filepath.Join(dir, "state"),
		// The tests' image servers listen on loopback, which the outbound policy refuses.
		FetchAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Upstream:   up,
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testSite is a Server running for one test.
type testSite struct {
	*Server
	up   *recorder
	base string
	cfg  Config
	stop func() error // ends Run and returns what it returned
}

// startSite runs a Server on cfg (from fixture) until the test ends.
func startSite(t *testing.T, cfg Config, tune ...func(*Server)) *testSite {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s.reports.retryMin, s.reports.retryMax = 5*time.Millisecond, 20*time.Millisecond
	s.cache.retryMin, s.cache.retryMax = 20*time.Millisecond, 50*time.Millisecond
	for _, f := range tune {
		f(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("Run did not get ready in 10 s")
	}
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(20 * time.Second):
				runErr = fmt.Errorf("Run did not return 20 s after its context ended")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	up, _ := cfg.Upstream.(*recorder)
	return &testSite{Server: s, up: up, base: s.Addrs().BaseURL, cfg: cfg, stop: stop}
}

// recorder is an Upstream that keeps what it is given, and fails or blocks when told to.
type recorder struct {
	mu      sync.Mutex
	got     []sent
	calls   int
	failN   int           // fail the next failN calls
	failErr error         // with this error
	gate    chan struct{} // non-nil: each call waits for a value from it
	atGate  chan struct{} // with gate: told (if it has room) when a call starts to wait there
	changed chan struct{}
}

type sent struct {
	Kind    string
	Payload any
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) Report(ctx context.Context, kind string, payload any) error {
	r.mu.Lock()
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		select {
		case r.atGate <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.failN > 0 {
		r.failN--
		return r.failErr
	}
	r.got = append(r.got, sent{kind, payload})
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) reports() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sent(nil), r.got...)
}

// waitFor waits until the reports received satisfy ok, for up to 10 s, looking again at each
// report (changed holds a wake-up for a report made while it looked). One test goroutine waits
// at a time.
func (r *recorder) waitFor(t testing.TB, what string, ok func([]sent) bool) []sent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		got := r.reports()
		if ok(got) {
			return got
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("no %s reported in 10 s; got %+v", what, got)
		}
	}
}

// ofKind is the payloads of one kind, in order.
func ofKind[P any](got []sent, kind string) []P {
	var out []P
	for _, s := range got {
		if s.Kind == kind {
			out = append(out, s.Payload.(P))
		}
	}
	return out
}

// httpDo sends a request to the test site and returns the status, body and headers.
func (ts *testSite) do(t testing.TB, method, path, token string, body string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.base+path, rd)
	must(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp.StatusCode, string(b), resp.Header
}

func toJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	must(t, err)
	return string(b)
}

// A plan with one machine of each kind, used across the tests.
const (
	macRamdisk = "52:54:00:00:00:01"
	macDisk    = "52:54:00:00:00:02"
	macSecond  = "52:54:00:00:00:03" // the ramdisk machine's second NIC
	macIdle    = "52:54:00:00:00:04"
	macUnknown = "52:54:00:00:00:99"
)

func testPlan(unknown string) siteapi.Plan {
	return siteapi.Plan{
		Site:    "site-1",
		Unknown: unknown,
		Machines: []siteapi.PlanMachine{
			{ID: "m-ramdisk", MACs: []string{macRamdisk, macSecond}, Boot: siteapi.BootRamdisk,
				Task: &siteapi.Task{ID: "task-1", Kind: siteapi.TaskWipe, Then: siteapi.ThenWait}},
			{ID: "m-disk", MACs: []string{macDisk}, Boot: siteapi.BootDisk},
			{ID: "m-idle", MACs: []string{macIdle}, Boot: siteapi.BootRamdisk},
		},
	}
}
