package embedded_test

import (
	"context"
	"errors"
	"os"
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
