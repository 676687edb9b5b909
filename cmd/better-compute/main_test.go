package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// build builds the better-compute binary once for all the tests of this run, next to the test
// binary: in go test's work directory, which the go command removes when the run ends.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		builtBin = filepath.Join(filepath.Dir(os.Args[0]), "better-compute")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build: %v", buildErr)
	}
	return builtBin
}

// started is a long-running better-compute process.
type started struct {
	cmd  *exec.Cmd
	done chan error
}

// startProcess runs bin with args until it prints every pattern's first group, or fails.
func startProcess(t *testing.T, bin string, env []string, args []string, patterns ...*regexp.Regexp) (*started, []string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &started{cmd: cmd, done: make(chan error, 1)}
	foundCh := make(chan []string, 1)
	go func() {
		// the output is read to the end, so the process never blocks on a full pipe
		found := make([]string, len(patterns))
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			for i, p := range patterns {
				if m := p.FindStringSubmatch(sc.Text()); m != nil && found[i] == "" {
					found[i] = m[1]
				}
			}
			if ready(found) {
				foundCh <- found
				found = nil
				break
			}
		}
		io.Copy(io.Discard, out)
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
		}
	})
	select {
	case f := <-foundCh:
		return s, f
	case err := <-s.done:
		t.Fatalf("%s %v exited before it was ready: %v", bin, args, err)
	case <-time.After(90 * time.Second):
		t.Fatalf("%s %v was not ready within 90s", bin, args)
	}
	return nil, nil
}

func ready(found []string) bool {
	for _, f := range found {
		if f == "" {
			return false
		}
	}
	return true
}

// cli runs the CLI once and returns its stdout, stderr and exit code.
func cli(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

// TestQuickstart runs docs/quickstart.md's steps: the development server with simulated GPU
// machines, then the CLI binary against it.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	bin := build(t)
	_, f := startProcess(t, bin, nil, []string{"dev", "--sim", "2", "--addr", "127.0.0.1:0", "--gateway", "127.0.0.1:0"},
		regexp.MustCompile(`URL:\s+(\S+)`), regexp.MustCompile(`API key:\s+(\S+)`), regexp.MustCompile(`Nodes:\s+(\d+)`))
	env := []string{"BETTER_COMPUTE_URL=" + f[0], "BETTER_COMPUTE_API_KEY=" + f[1]}

	// List the nodes: two, online, in a table.
	out, errOut, code := cli(t, bin, env, "nodes", "list", "--pool", "gpu")
	if code != 0 || strings.Count(out, "online") != 2 || !strings.HasPrefix(out, "ID") {
		t.Fatalf("nodes list = %d\n%s%s", code, out, errOut)
	}
	// Reserve 8 GPUs, as JSON for a script.
	out, errOut, code = cli(t, bin, env, "reservations", "create", "--pool", "gpu", "--gpus", "8", "-o", "json")
	var r api.Reservation
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.State != api.ReservationActive || len(r.Allocations[0].GPUs) != 8 {
		t.Fatalf("reservations create = %d\n%s%s", code, out, errOut)
	}
	// See it.
	out, _, code = cli(t, bin, env, "reservations", "get", r.ID)
	if code != 0 || !strings.Contains(out, "active") || !strings.Contains(out, r.ID) {
		t.Fatalf("reservations get = %d\n%s", code, out)
	}
	out, _, code = cli(t, bin, env, "capacity", "summary", "gpu", "-o", "json")
	var s api.PoolCapacity
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s.Models[0].Used != 8 || s.Models[0].Total != 16 {
		t.Fatalf("capacity summary = %d\n%s", code, out)
	}
	// Release it.
	out, _, code = cli(t, bin, env, "reservations", "release", r.ID, "-o", "json")
	if code != 0 || !strings.Contains(out, `"state": "released"`) {
		t.Fatalf("reservations release = %d\n%s", code, out)
	}

	// The events of that, from the log, as JSON lines.
	out, errOut, code = cli(t, bin, env, "events", "watch", "--type", "reservation.", "--count", "2", "-o", "json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var created, released api.Event
	if code != 0 || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &created) != nil || json.Unmarshal([]byte(lines[1]), &released) != nil ||
		created.Type != "reservation.created" || released.Type != "reservation.released" || created.Subject != r.ID || released.ID <= created.ID {
		t.Fatalf("events watch = %d\n%s%s", code, out, errOut)
	}

	// A server error: its code, a message, a non-zero exit.
	_, errOut, code = cli(t, bin, env, "pools", "get", "nope")
	if code != 1 || !strings.Contains(errOut, `not_found: pool "nope" not found`) {
		t.Fatalf("pools get nope = %d %q", code, errOut)
	}
	_, errOut, code = cli(t, bin, env, "reservations", "create", "--pool", "gpu", "--gpus", "-3")
	if code != 1 || !strings.Contains(errOut, "invalid_argument") || !strings.Contains(errOut, "field: gpus") {
		t.Fatalf("a bad request = %d %q", code, errOut)
	}
	// A bad flag: a usage error, exit 2.
	_, errOut, code = cli(t, bin, env, "pools", "list", "--limit", "many")
	if code != 2 || !strings.Contains(errOut, "--limit") {
		t.Fatalf("a bad flag = %d %q", code, errOut)
	}
	// A wrong key.
	_, errOut, code = cli(t, bin, []string{"BETTER_COMPUTE_URL=" + f[0], "BETTER_COMPUTE_API_KEY=biam_key_wrong"}, "pools", "list")
	if code != 1 || !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("a wrong key = %d %q", code, errOut)
	}
	// No URL at all.
	_, errOut, code = cli(t, bin, []string{"BETTER_COMPUTE_URL=", "HOME=" + t.TempDir(), "XDG_CONFIG_HOME=" + t.TempDir()}, "pools", "list")
	if code != 2 || !strings.Contains(errOut, "BETTER_COMPUTE_URL") {
		t.Fatalf("no URL = %d %q", code, errOut)
	}
	// The MCP tools over stdio, from the same binary.
	mcpCmd := exec.Command(bin, "mcp")
	mcpCmd.Env = append(os.Environ(), env...)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: mcpCmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tool := range tools.Tools {
		names[tool.Name] = true
	}
	// Every core method, and the metal module's, which better-compute dev runs.
	for _, m := range append(api.Methods(), metal.Methods()...) {
		if !names[m.Group+"_"+m.Name] {
			t.Errorf("no MCP tool for %s.%s", m.Group, m.Name)
		}
	}
	if !names["machines_deploy"] || !names["leases_create"] {
		t.Errorf("the metal module's deploys and leases are not MCP tools")
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "nodes_list", Arguments: map[string]any{"pool": "gpu"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "sim-00001") {
		t.Fatalf("nodes_list over stdio = %+v, %v", res, err)
	}
	cs.Close()

	// The config file works too.
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"url": "`+f[0]+`", "apiKey": "`+f[1]+`"}`), 0o600)
	out, _, code = cli(t, bin, []string{"BETTER_COMPUTE_URL=", "BETTER_COMPUTE_API_KEY="}, "--config", cfg, "pools", "list", "-o", "json")
	if code != 0 || !strings.Contains(out, `"name": "gpu"`) {
		t.Fatalf("with a config file = %d\n%s", code, out)
	}
}

// TestServeModesOnOneDatabase runs an api process and a gateway+worker pair on one database:
// simulated nodes join through the api process, hold sessions with the gateway, and a command
// created through the api reaches them.
func TestServeModesOnOneDatabase(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs binaries")
	}
	bin := build(t)
	dbURL := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + dbURL, "BETTER_COMPUTE_SECRET=serve-test-secret-0123456789abcdefgh"}
	gwPort := freePort(t)
	_, f := startProcess(t, bin, env, []string{"serve", "--mode", "api", "--listen", "127.0.0.1:0", "--gateway-address", "127.0.0.1:" + gwPort},
		regexp.MustCompile(`serving, mode api, on (\S+)`))
	apiURL := "http://" + f[0]
	startProcess(t, bin, env, []string{"serve", "--mode", "gateway", "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:" + gwPort, "--gateway-hosts", "127.0.0.1"},
		regexp.MustCompile(`serving, mode (gateway), on`))
	startProcess(t, bin, env, []string{"serve", "--mode", "worker", "--listen", "127.0.0.1:0"}, regexp.MustCompile(`serving, mode (worker), on`))

	key, _, code := cli(t, bin, env, "iam", "admin-key", "--name", "ops")
	key = strings.TrimSpace(key)
	if code != 0 || !strings.HasPrefix(key, "biam_key_") {
		t.Fatalf("iam admin-key = %d %q", code, key)
	}
	cenv := []string{"BETTER_COMPUTE_URL=" + apiURL, "BETTER_COMPUTE_API_KEY=" + key}
	if _, e, code := cli(t, bin, cenv, "pools", "create", "--name", "h100"); code != 0 {
		t.Fatal(e)
	}
	out, _, _ := cli(t, bin, cenv, "join-tokens", "create", "--pool", "h100", "--max-uses", "2", "-o", "json")
	var tok api.JoinToken
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatalf("join token: %v\n%s", err, out)
	}
	startProcess(t, bin, cenv, []string{"sim", "--nodes", "2", "--token", tok.Token}, regexp.MustCompile(`sim: (\d+) nodes connected`))
	out, _, _ = cli(t, bin, cenv, "nodes", "list", "-o", "json")
	var nodes api.Page[api.Node]
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || len(nodes.Items) != 2 {
		t.Fatalf("nodes: %v\n%s", err, out)
	}
	out, _, _ = cli(t, bin, cenv, "commands", "create", "--node", nodes.Items[0].ID, "--kind", "health.check", "-o", "json")
	var cmd api.Command
	if err := json.Unmarshal([]byte(out), &cmd); err != nil {
		t.Fatalf("command: %v\n%s", err, out)
	}
	computetest.Eventually(t, 20*time.Second, "the command back through the gateway process", func() bool {
		out, _, _ = cli(t, bin, cenv, "commands", "get", cmd.ID, "-o", "json")
		json.Unmarshal([]byte(out), &cmd)
		return cmd.State == api.CommandSucceeded
	})
	// Health and readiness of the api process.
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := httpGet(apiURL + path)
		if err != nil || resp != 200 {
			t.Fatalf("GET %s = %d, %v", path, resp, err)
		}
	}
	// The processes share one embedded IAM: a key made in the database works everywhere.
	db, err := postgres.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var sessions int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM compute.node_sessions`).Scan(&sessions)
	if sessions != 2 {
		t.Fatalf("%d sessions recorded", sessions)
	}
}
