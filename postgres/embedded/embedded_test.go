package embedded_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres/embedded"
)

func TestNoBinaries(t *testing.T) {
	_, err := embedded.Start(context.Background(), embedded.Options{BinDir: t.TempDir()})
	if !errors.Is(err, embedded.ErrNoBinaries) {
		t.Fatalf("Start with an empty BinDir = %v, want ErrNoBinaries", err)
	}
	for _, hint := range []string{"apt-get install postgresql", "BETTER_COMPUTE_DATABASE_URL"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("the error does not say %q: %v", hint, err)
		}
	}
}

func TestStartStopKeepsNothing(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Start(ctx, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var fsync string
	if err := conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if fsync != "off" {
		t.Errorf("an ephemeral cluster has fsync %s, want off", fsync)
	}
	dir := c.DataDir()
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the ephemeral data directory %s survived Stop: %v", dir, err)
	}
}

func TestDataDirSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	// Not t.TempDir: it is 0700, and the server may run as another user (postgres, under root).
	parent, err := os.MkdirTemp("", "embedded-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := parent + "/pg"
	for i := range 2 {
		c, err := embedded.Start(ctx, embedded.Options{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			_, err = conn.Exec(ctx, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)")
		} else {
			var x int
			err = conn.QueryRow(ctx, "SELECT x FROM kept").Scan(&x)
			if err == nil && x != 42 {
				t.Fatalf("kept.x = %d after a restart", x)
			}
		}
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLocalUsersNeedThePassword: the cluster trusts nobody on loopback: a connection without
// its generated password, or with another, is refused; the URL it returns carries it.
func TestLocalUsersNeedThePassword(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Start(ctx, embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	good, err := url.Parse(c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if pw, ok := good.User.Password(); !ok || len(pw) < 32 {
		t.Fatalf("the URL %s carries no generated password", good.Redacted())
	}
	for _, u := range []*url.Userinfo{url.User(embedded.Superuser), url.UserPassword(embedded.Superuser, "wrong"), url.User("nobody")} {
		bad := *good
		bad.User = u
		if conn, err := pgx.Connect(ctx, bad.String()); err == nil {
			conn.Close(ctx)
			t.Fatalf("%s connected without the password", bad.Redacted())
		}
	}
	conn, err := pgx.Connect(ctx, good.String())
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
}

// TestOldTrustClusterIsSecured: a data directory made when clusters trusted loopback (no
// password file) gets a password and password authentication when it is started again.
func TestOldTrustClusterIsSecured(t *testing.T) {
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "embedded-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := parent + "/pg"
	c, err := embedded.Start(ctx, embedded.Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Make it what an old version left: trust on loopback and no password file.
	trust := "local all all trust\nhost all all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(dir, "pg_hba.conf"), []byte(trust), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "better-compute.password")); err != nil {
		t.Fatal(err)
	}
	c, err = embedded.Start(ctx, embedded.Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	u, _ := url.Parse(c.URL("postgres"))
	if _, ok := u.User.Password(); !ok {
		t.Fatal("the secured cluster's URL has no password")
	}
	u.User = url.User(embedded.Superuser)
	if conn, err := pgx.Connect(ctx, u.String()); err == nil {
		conn.Close(ctx)
		t.Fatal("the old cluster still trusts loopback")
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
}
