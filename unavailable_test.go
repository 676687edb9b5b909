package compute_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
)

// TestDatabaseGoneAnswersUnavailable: a call whose connection the database cuts (a restart, an
// administrator) answers 503 unavailable, in words that name neither host nor user, and nothing
// of it is written.
func TestDatabaseGoneAnswersUnavailable(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	url := env.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Hold the pools table so that the call waits inside its transaction, then cut its connection.
	lock, err := env.DB.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, `LOCK TABLE compute.pools IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	answered := make(chan call, 1)
	go func() { answered <- post(t, url, env.RootKey, "pools/create", `{"name": "cut"}`) }()
	computetest.Eventually(t, 30*time.Second, "the call waiting on the lock, its connection cut", func() bool {
		return computetest.Count(t, env.DB.Pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query ILIKE '%compute.pools%'`) > 0
	})
	c := <-answered
	if c.status != http.StatusServiceUnavailable || c.errCode() != "unavailable" || c.errDetail("reason") != "database_unavailable" {
		t.Fatalf("a call whose connection was cut: %d %s", c.status, c.raw)
	}
	for _, leak := range []string{"postgres://", "user=", "127.0.0.1", "password"} {
		if strings.Contains(string(c.raw), leak) {
			t.Errorf("the answer leaks %q: %s", leak, c.raw)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.pools"); n != 0 {
		t.Fatalf("the cut call left %d pools", n)
	}
	if c := post(t, url, env.RootKey, "pools/create", `{"name": "after"}`); c.status != http.StatusOK {
		t.Fatalf("a call after the cut: %d %s", c.status, c.raw)
	}
}
