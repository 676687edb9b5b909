package devserver_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/postgres"
)

// start starts a devserver on free ports with o, and stops it when the test ends.
func start(t *testing.T, o devserver.Options) *devserver.Server {
	t.Helper()
	o.Addr, o.GatewayAddr = "127.0.0.1:0", "127.0.0.1:0"
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := devserver.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop(t, s) })
	return s
}

func stop(t *testing.T, s *devserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Error(err)
	}
}

// dataDir is a data directory the postgres user can reach when the tests run as root.
func dataDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "devserver-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestDataDirKeepsTheAPIKey: a devserver restarted on its data directory answers with the key it
// gave before (it made a new one at each start, while the old ones stayed valid), and says where
// it keeps it; a kept key that no longer authenticates is replaced.
func TestDataDirKeepsTheAPIKey(t *testing.T) {
	if os.Getenv(postgres.EnvDatabaseURL) != "" {
		t.Skip("the embedded PostgreSQL's data directory; $BETTER_COMPUTE_DATABASE_URL is set")
	}
	t.Parallel()
	dir := dataDir(t)
	first := start(t, devserver.Options{DataDir: dir})
	stop(t, first)
	second := start(t, devserver.Options{DataDir: dir})
	if second.APIKey != first.APIKey {
		t.Fatalf("a restart on %s gave a new API key", dir)
	}
	if want := filepath.Join(dir, "api-key"); second.APIKeyFile != want {
		t.Errorf("APIKeyFile = %q, want %q", second.APIKeyFile, want)
	}
	var out strings.Builder
	second.Describe(&out)
	if !strings.Contains(out.String(), second.APIKeyFile) {
		t.Errorf("the banner does not say where the key is kept:\n%s", out.String())
	}
	// Scripts cut the key out of its line (hack/gpu-check.sh): the note is on another.
	if m := regexp.MustCompile(`(?m)^  API key: +(.*)$`).FindStringSubmatch(out.String()); m == nil || m[1] != second.APIKey {
		t.Errorf("the API key's line is not the key alone:\n%s", out.String())
	}
	cl, err := client.New(second.URL, client.WithAPIKey(second.APIKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Pools.List(context.Background(), api.ListPools{}); err != nil {
		t.Fatalf("the kept key after a restart: %v", err)
	}
	stop(t, second)
	if err := os.WriteFile(second.APIKeyFile, []byte("biam_key_not-a-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	third := start(t, devserver.Options{DataDir: dir})
	if third.APIKey == "biam_key_not-a-key" || third.APIKey == first.APIKey {
		t.Fatalf("a kept key that does not authenticate was given again: %q", third.APIKey)
	}
	if b, err := os.ReadFile(third.APIKeyFile); err != nil || strings.TrimSpace(string(b)) != third.APIKey {
		t.Fatalf("the new key is not kept: %q, %v", b, err)
	}
}

// TestChosenDatabaseIsPrinted: the embedded PostgreSQL's port and password can be chosen, and
// the banner prints a URL that connects with them.
func TestChosenDatabaseIsPrinted(t *testing.T) {
	if os.Getenv(postgres.EnvDatabaseURL) != "" {
		t.Skip("the embedded PostgreSQL; $BETTER_COMPUTE_DATABASE_URL is set")
	}
	t.Parallel()
	port := freePort(t)
	s := start(t, devserver.Options{PostgresPort: port, PostgresPassword: "chosen-pw"})
	u, err := url.Parse(s.Database)
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); u.Port() != strconv.Itoa(port) || pw != "chosen-pw" {
		t.Fatalf("Database = %s, want port %d and the chosen password", u.Redacted(), port)
	}
	var out strings.Builder
	s.Describe(&out)
	if !strings.Contains(out.String(), s.Database) {
		t.Errorf("the banner does not print the database's URL:\n%s", out.String())
	}
	conn, err := pgx.Connect(context.Background(), s.Database)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
}

// TestChosenDatabaseNeedsTheEmbeddedOne: a port or password chosen for the embedded PostgreSQL
// while $BETTER_COMPUTE_DATABASE_URL names another server is refused, not ignored.
func TestChosenDatabaseNeedsTheEmbeddedOne(t *testing.T) {
	t.Setenv(postgres.EnvDatabaseURL, "postgres://nobody@127.0.0.1:1/none")
	for _, o := range []devserver.Options{{PostgresPort: 5433}, {PostgresPassword: "x"}} {
		_, err := devserver.Start(context.Background(), o)
		if !errors.Is(err, devserver.ErrEmbeddedOnly) || !strings.Contains(err.Error(), "BETTER_COMPUTE_DATABASE_URL") {
			t.Errorf("Start(%+v) with $BETTER_COMPUTE_DATABASE_URL set: %v", o, err)
		}
	}
}

// TestPrivateWebhooks: with AllowPrivateWebhooks, an endpoint on this machine is accepted and
// gets its deliveries (what trying webhooks locally needs); without it, it is refused naming url.
func TestPrivateWebhooks(t *testing.T) {
	t.Parallel()
	got := make(chan string, 10)
	receiver := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- string(b)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go receiver.Serve(ln)
	t.Cleanup(func() { receiver.Close() })
	hook := "http://" + ln.Addr().String() + "/hook"
	ctx := context.Background()

	for _, allow := range []bool{false, true} {
		s := start(t, devserver.Options{AllowPrivateWebhooks: allow})
		cl, err := client.New(s.URL, client.WithAPIKey(s.APIKey))
		if err != nil {
			t.Fatal(err)
		}
		w, err := cl.Webhooks.Create(ctx, api.CreateWebhook{URL: hook})
		if !allow {
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeInvalidArgument || e.Details["field"] != "url" {
				t.Fatalf("a loopback endpoint without AllowPrivateWebhooks: %v, want invalid_argument naming url", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("a loopback endpoint with AllowPrivateWebhooks: %v", err)
		}
		if _, err := cl.Webhooks.Test(ctx, api.WebhookRef{Webhook: w.ID}); err != nil {
			t.Fatal(err)
		}
		select {
		case body := <-got:
			if !strings.Contains(body, "webhook.test") {
				t.Errorf("the receiver got %s, want the webhook.test event", body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery reached the loopback receiver within 30 s")
		}
	}
}

// doubled says whether msg repeats a prefix, as "devserver: devserver: …" did.
func doubled(msg string) bool {
	parts := strings.Split(msg, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return true
		}
	}
	return false
}

// TestStartErrorsNameTheDevserverOnce: whatever fails at start, the error says "devserver: " once
// (a main prints it as it is), never a prefix twice.
func TestStartErrorsNameTheDevserverOnce(t *testing.T) {
	if os.Getenv(postgres.EnvDatabaseURL) != "" {
		t.Skip("the embedded PostgreSQL; $BETTER_COMPUTE_DATABASE_URL is set")
	}
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the cases, which run in parallel
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pgPort := busy.Addr().(*net.TCPAddr).Port
	for name, o := range map[string]devserver.Options{
		"API port taken":      {Addr: busy.Addr().String(), GatewayAddr: "127.0.0.1:0"},
		"gateway port taken":  {Addr: "127.0.0.1:0", GatewayAddr: busy.Addr().String()},
		"data dir is a file":  {Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", DataDir: file},
		"postgres port taken": {Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", PostgresPort: pgPort},
		"bad password":        {Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", PostgresPassword: " x"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each starts an embedded PostgreSQL first
			o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			_, err := devserver.Start(context.Background(), o)
			switch {
			case err == nil:
				t.Errorf("%s: started", name)
			case !strings.HasPrefix(err.Error(), "devserver: ") || doubled(err.Error()):
				t.Errorf("%s: %q, want one \"devserver: \" prefix and none doubled", name, err)
			}
		})
	}
}

func TestDoubled(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]bool{
		"devserver: devserver: listen":           true,
		"devserver: listen on x: address in use": false,
		"a: b: a: c":                             false,
		"unauthenticated: unauthenticated: no":   true,
	} {
		if doubled(msg) != want {
			t.Errorf("doubled(%q) = %v", msg, !want)
		}
	}
}
