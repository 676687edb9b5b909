package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestDevSimIsReadyWhenCapacityIs: once the devserver with simulated nodes says it is up (what
// `dev --sim N` prints its banner after), the nodes' GPUs are counted and schedulable, so the
// first request for a whole node succeeds. It starts the devserver a few times, because the
// inventory racing the banner was lost only sometimes.
func TestDevSimIsReadyWhenCapacityIs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the devserver with simulated nodes")
	}
	for i := range 3 {
		t.Setenv(postgres.EnvDatabaseURL, pgtest.URL(t))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := devserver.Start(ctx, devserver.Options{Sim: 2, Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		sum, err := s.Compute.API.Capacity.Summary(ctx, s.APIKey, api.SummarizeCapacity{Pool: devserver.SimPool})
		total := 0
		for _, m := range sum.Models {
			total += m.Total
		}
		if err != nil || sum.Schedulable != 2 || total != 16 {
			t.Errorf("start %d: capacity when ready = %+v, %v; want 2 schedulable nodes with 16 GPUs", i, sum, err)
		}
		r, err := s.Compute.API.Reservations.Create(ctx, s.APIKey, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 8}})
		if err != nil || r.State != api.ReservationActive {
			t.Errorf("start %d: the first 8-GPU reservation = %+v, %v", i, r, err)
		}
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		cancel()
	}
}

func subcommand(t *testing.T, name string) *cobra.Command {
	t.Helper()
	c, _, err := newRoot(&profile{}).Find([]string{name})
	if err != nil || c.Name() != name {
		t.Fatalf("no %s command: %v", name, err)
	}
	return c
}

// TestDevAndServeShareFlags: dev, serve and the devserver name what they share the same way
// (--listen and --gateway-listen were --addr and --gateway in dev, -addr and -gateway in the
// devserver), both listen on loopback unless told otherwise (serve bound every interface), and
// -v, verbose here and the version on the root, is only a deprecated shorthand.
func TestDevAndServeShareFlags(t *testing.T) {
	t.Parallel()
	dev, serve := subcommand(t, "dev"), subcommand(t, "serve")
	for _, name := range []string{"listen", "gateway-listen", "verbose", "allow-private-webhooks"} {
		for _, c := range []*cobra.Command{dev, serve} {
			f := c.Flags().Lookup(name)
			switch {
			case f == nil:
				t.Errorf("%s has no --%s", c.Name(), name)
			case strings.Contains(name, "listen") && !strings.HasPrefix(f.DefValue, "127.0.0.1:"):
				t.Errorf("%s --%s defaults to %q, want a loopback address", c.Name(), name, f.DefValue)
			case f.Shorthand != "":
				t.Errorf("%s --%s has the shorthand -%s", c.Name(), name, f.Shorthand)
			}
		}
	}
	for _, name := range []string{"data-dir", "sim", "postgres-port", "postgres-password"} {
		if dev.Flags().Lookup(name) == nil {
			t.Errorf("dev has no --%s", name)
		}
	}
	for old := range devserver.Deprecated {
		if f := dev.Flags().Lookup(old); f == nil || f.Deprecated == "" {
			t.Errorf("dev --%s is not kept as a deprecated alias: %+v", old, f)
		}
	}
	for _, c := range []*cobra.Command{dev, serve} {
		if f := c.Flags().ShorthandLookup("v"); f == nil || f.ShorthandDeprecated == "" {
			t.Errorf("%s -v is not a deprecated shorthand: %+v", c.Name(), f)
		}
	}
}

// TestServeRefusesPrivateWebhooksUnlessTold: --allow-private-webhooks lets any tenant's webhooks
// reach the host's network, so serve refuses it as a usage error unless --i-know-it-is-unsafe
// says it is meant; with both, the option reaches the control plane.
func TestServeRefusesPrivateWebhooksUnlessTold(t *testing.T) {
	t.Parallel()
	secret := strings.Repeat("s", 32)
	var stderr bytes.Buffer
	code := run([]string{"serve", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--secret", secret, "--allow-private-webhooks"}, io.Discard, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "--i-know-it-is-unsafe") {
		t.Fatalf("serve --allow-private-webhooks alone: exit %d, %s; want 2 naming --i-know-it-is-unsafe", code, stderr.String())
	}
	if testing.Short() {
		return
	}
	for _, allow := range []bool{false, true} {
		cfg := serveConfig{Mode: "all", RootTenant: "root", Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0",
			DatabaseURL: pgtest.URL(t), Secret: secret, AllowPrivateWebhooks: allow, IKnowItIsUnsafe: allow}
		url, key := startServe(t, cfg)
		cl, err := client.New(url, client.WithAPIKey(key))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.Webhooks.Create(context.Background(), api.CreateWebhook{URL: "http://127.0.0.1:9/hook"})
		if allow && err != nil {
			t.Errorf("a loopback webhook with --allow-private-webhooks: %v", err)
		}
		var e *api.Error
		if !allow && (!errors.As(err, &e) || e.Details["field"] != "url") {
			t.Errorf("a loopback webhook without --allow-private-webhooks: %v, want invalid_argument naming url", err)
		}
	}
}

// startServe runs serve in this process until the test ends, and returns its URL and a root key.
func startServe(t *testing.T, cfg serveConfig) (string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), w)
		w.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	serving := regexp.MustCompile(`serving, mode all, on (\S+)`)
	buf := make([]byte, 4096)
	var out string
	for !serving.MatchString(out) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("serve ended before serving: %v\n%s", <-done, out)
		}
		out += string(buf[:n])
	}
	go io.Copy(io.Discard, r)
	url := "http://" + serving.FindStringSubmatch(out)[1]
	key, err := adminKey(t, cfg.DatabaseURL, cfg.RootTenant)
	if err != nil {
		t.Fatal(err)
	}
	return url, key
}

// adminKey makes a key with every right in the root tenant of the database at dbURL.
func adminKey(t *testing.T, dbURL, root string) (string, error) {
	db, err := postgres.Open(context.Background(), dbURL)
	if err != nil {
		return "", err
	}
	defer db.Close()
	port, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: root})
	if err != nil {
		return "", err
	}
	k, err := port.CreateAdminKey(context.Background(), root, "test")
	return k.Token, err
}

// TestDevPrintsItsDatabase: dev prints the embedded PostgreSQL's URL (with the port and password
// chosen), and says when webhooks may reach private addresses.
func TestDevPrintsItsDatabase(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the CLI")
	}
	bin := build(t)
	_, f := startProcess(t, bin, []string{postgres.EnvDatabaseURL + "="}, []string{"dev", "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
		"--postgres-password", "pw-of-mine", "--allow-private-webhooks"},
		regexp.MustCompile(`Database:\s+(\S+)`), regexp.MustCompile(`Webhooks:\s+(.+)`), regexp.MustCompile(`API key:\s+(\S+)`))
	if !strings.HasPrefix(f[0], "postgres://postgres:pw-of-mine@127.0.0.1:") {
		t.Errorf("Database: %s, want the chosen password on loopback", f[0])
	}
	if !strings.Contains(f[1], "--allow-private-webhooks") {
		t.Errorf("Webhooks: %s", f[1])
	}
}

// TestDevChosenDatabaseWithAnother: a PostgreSQL port chosen while $BETTER_COMPUTE_DATABASE_URL
// names another server is a mistake in the command line: exit 2, naming the variable.
func TestDevChosenDatabaseWithAnother(t *testing.T) {
	t.Setenv(postgres.EnvDatabaseURL, "postgres://nobody@127.0.0.1:1/none")
	var stderr bytes.Buffer
	if code := run([]string{"dev", "--postgres-port", "5433"}, io.Discard, &stderr); code != exitUsage || !strings.Contains(stderr.String(), postgres.EnvDatabaseURL) {
		t.Fatalf("dev --postgres-port with $%s set: exit %d, %s", postgres.EnvDatabaseURL, code, stderr.String())
	}
}
