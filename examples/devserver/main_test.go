package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// devserverBinary builds the devserver once for the package's tests, as `go build` would.
func devserverBinary(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds and runs the devserver binary")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "devserver-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "devserver")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			buildErr = err
			binPath = string(out)
		}
	})
	if buildErr != nil {
		tb.Fatalf("build: %v\n%s", buildErr, binPath)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" && buildErr == nil {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// banner runs the devserver with args and reads its banner, the lines up to the CA hash.
func banner(t testing.TB, bin string, args ...string) (*exec.Cmd, map[string]string, io.Reader) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fields := map[string]string{}
	line := regexp.MustCompile(`^\s+([A-Za-z ]+):\s+(\S+)`)
	lines := bufio.NewScanner(stdout)
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	for fields["CA hash"] == "" && lines.Scan() {
		if m := line.FindStringSubmatch(lines.Text()); m != nil {
			fields[m[1]] = m[2]
		}
	}
	deadline.Stop()
	go io.Copy(io.Discard, stdout)
	return cmd, fields, stderr
}

// interrupt stops the devserver as Ctrl-C does, and wants a clean exit.
func interrupt(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the devserver did not stop cleanly on Ctrl-C: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the devserver did not stop within 30s of Ctrl-C")
	}
}

// TestDevserverProcess builds and runs the real devserver binary, as the README tells a new user
// to, and talks to it with plain HTTP.
func TestDevserverProcess(t *testing.T) {
	t.Parallel()
	bin := devserverBinary(t)
	cmd, f, stderr := banner(t, bin, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0")
	go io.Copy(os.Stderr, stderr)
	url, key, hash := f["URL"], f["API key"], f["CA hash"]
	if url == "" || key == "" || !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(hash) || !strings.HasPrefix(f["Database"], "postgres://") {
		t.Fatalf("the devserver did not print its URL, API key, database and CA hash: %v", f)
	}

	list := func(k string) (int, map[string]any) {
		req, _ := http.NewRequest("POST", url+"/api/compute/pools/list", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	if status, body := list(key); status != 200 || body["items"] == nil {
		t.Fatalf("pools/list with the printed key = %d %v", status, body)
	}
	wrong := key[:len(key)-4] + "AAAA"
	if status, body := list(wrong); status != 401 || body["error"].(map[string]any)["code"] != "unauthenticated" {
		t.Fatalf("pools/list with a wrong key = %d %v, want 401 unauthenticated", status, body)
	}
	interrupt(t, cmd)
}

// TestDevserverOldFlags: the flags the devserver had before (-addr, -gateway, -v) still work,
// and it says which replace them.
func TestDevserverOldFlags(t *testing.T) {
	t.Parallel()
	bin := devserverBinary(t)
	cmd, f, stderr := banner(t, bin, "-addr", "127.0.0.1:0", "-gateway", "127.0.0.1:0", "-v")
	if f["URL"] == "" {
		t.Fatalf("no banner with the old flags: %v", f)
	}
	var log strings.Builder
	done := make(chan struct{})
	go func() { io.Copy(&log, stderr); close(done) }()
	interrupt(t, cmd)
	<-done
	for _, want := range []string{"-addr is deprecated: use --listen", "-gateway is deprecated: use --gateway-listen", "-v is deprecated: use --verbose"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, log.String())
		}
	}
}

// TestDevserverFlagsAreTheCLIs: the devserver's flags are better-compute dev's names
// (devserver.Options.Flags defines both); its help lists them.
func TestDevserverFlagsAreTheCLIs(t *testing.T) {
	t.Parallel()
	bin := devserverBinary(t)
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, name := range []string{"listen", "gateway-listen", "data-dir", "sim", "postgres-port", "postgres-password", "allow-private-webhooks", "verbose"} {
		if !regexp.MustCompile(`(?m)^\s+-` + name + `\b`).Match(out) {
			t.Errorf("-h does not list -%s:\n%s", name, out)
		}
	}
}

// TestDevserverErrorsSayDevserverOnce: a start that fails exits 1 with one line that names the
// devserver once and the flag to change (it said "devserver: devserver: …").
func TestDevserverErrorsSayDevserverOnce(t *testing.T) {
	t.Parallel()
	bin := devserverBinary(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, args := range [][]string{
		{"--listen", busy.Addr().String(), "--gateway-listen", "127.0.0.1:0"},
		{"--listen", "127.0.0.1:0", "--gateway-listen", busy.Addr().String()},
		{"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--postgres-password", " padded"},
	} {
		cmd := exec.Command(bin, args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
			t.Errorf("%v: %v, want exit status 1", args, err)
		}
		msg := stderr.String()
		if strings.Count(msg, "devserver: ") != 1 {
			t.Errorf("%v: stderr %q, want \"devserver: \" once", args, msg)
		}
		for _, m := range regexp.MustCompile(`([\w-]+): ([\w-]+): `).FindAllStringSubmatch(msg, -1) {
			if m[1] == m[2] {
				t.Errorf("%v: a doubled prefix in %q", args, msg)
			}
		}
	}
}

var coldIdle = flag.Duration("coldstart.idle", 0, "BenchmarkColdStart waits this long, untimed, before each start: the disk settles after the last cluster's removal (docs/benchmarks.md)")

// BenchmarkColdStart is the devserver's cold start as a user has it: the built binary on a
// fresh, temporary database, from exec to the printed banner (docs/benchmarks.md, "Cold start").
// The first start, which may make the machine's PostgreSQL template, is not timed.
func BenchmarkColdStart(b *testing.B) {
	bin := devserverBinary(b)
	run := func() {
		b.StopTimer()
		time.Sleep(*coldIdle) // not a synchronisation: the conditions measured
		b.StartTimer()
		cmd, f, stderr := banner(b, bin, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0")
		go io.Copy(io.Discard, stderr)
		if f["URL"] == "" {
			b.Fatal("no banner")
		}
		b.StopTimer()
		interrupt(b, cmd)
		b.StartTimer()
	}
	run()
	b.ResetTimer()
	for b.Loop() {
		run()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/start")
}
