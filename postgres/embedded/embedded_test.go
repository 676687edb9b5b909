package embedded_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// startIn starts a cluster with opts and stops it when the test ends.
func startIn(t *testing.T, opts embedded.Options) *embedded.Cluster {
	t.Helper()
	c, err := embedded.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	return c
}

func password(t *testing.T, c *embedded.Cluster) string {
	t.Helper()
	u, err := url.Parse(c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	return pw
}

// templates lists what a template cache holds.
func templates(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestClustersAreCopiedFromOneTemplate: the first cluster leaves a template in the cache, and
// the next is a copy of it (initdb is what made a cold start slow); each copy has a password of
// its own, so the template's opens none of them.
func TestClustersAreCopiedFromOneTemplate(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	a := startIn(t, embedded.Options{TemplateDir: cache})
	names := templates(t, cache)
	if len(names) != 1 {
		t.Fatalf("the template cache holds %v after a first start, want one template", names)
	}
	tpl := filepath.Join(cache, names[0])
	tplPassword, err := os.ReadFile(filepath.Join(tpl, "better-compute.password"))
	if err != nil {
		t.Fatal(err)
	}
	// A file only the template has shows that the next cluster was copied from it.
	if err := os.WriteFile(filepath.Join(tpl, "copied-from-template"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b := startIn(t, embedded.Options{TemplateDir: cache})
	if _, err := os.Stat(filepath.Join(b.DataDir(), "copied-from-template")); err != nil {
		t.Fatalf("the second cluster was not copied from the template: %v", err)
	}
	pa, pb, pt := password(t, a), password(t, b), strings.TrimSpace(string(tplPassword))
	if pa == pb || pa == pt || pb == pt {
		t.Fatalf("passwords: first %q, second %q, template %q; want three different ones", pa, pb, pt)
	}
	ctx := context.Background()
	for _, c := range []*embedded.Cluster{a, b} {
		u, _ := url.Parse(c.URL("postgres"))
		u.User = url.UserPassword(embedded.Superuser, pt)
		if conn, err := pgx.Connect(ctx, u.String()); err == nil {
			conn.Close(ctx)
			t.Fatalf("the template's password opens the cluster in %s", c.DataDir())
		}
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}
}

// TestClustersStartTogetherOnAnEmptyCache: processes that find no template at once each make
// one; one of them is kept, whole, and nothing half-made is left behind.
func TestClustersStartTogetherOnAnEmptyCache(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := embedded.Start(context.Background(), embedded.Options{TemplateDir: cache})
			if err == nil {
				err = c.Stop(context.Background())
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	names := templates(t, cache)
	if len(names) != 1 {
		t.Fatalf("the template cache holds %v, want one template", names)
	}
	if _, err := os.Stat(filepath.Join(cache, names[0], "PG_VERSION")); err != nil {
		t.Fatalf("the template is not a whole cluster: %v", err)
	}
	startIn(t, embedded.Options{TemplateDir: cache})
}

// TestChosenPortAndPassword: a caller may choose the port and the superuser's password (the
// devserver prints them); a restart with another password changes it; a taken port is an error
// naming it.
func TestChosenPortAndPassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	parent, err := os.MkdirTemp("", "embedded-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	const first, second = `it's "mine"`, "another one"
	c, err := embedded.Start(ctx, embedded.Options{DataDir: parent + "/pg", Port: port, Password: first})
	if err != nil {
		t.Fatal(err)
	}
	if c.Port() != port || password(t, c) != first {
		t.Fatalf("port %d, password %q; want %d, %q", c.Port(), password(t, c), port, first)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if _, err := embedded.Start(ctx, embedded.Options{Port: port}); err == nil || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("a second cluster on port %d: %v, want an error naming the port", port, err)
	}
	oldURL := c.URL("postgres")
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	c = startIn(t, embedded.Options{DataDir: parent + "/pg", Password: second})
	if password(t, c) != second {
		t.Fatalf("password after a restart with another = %q", password(t, c))
	}
	old, _ := url.Parse(oldURL)
	now, _ := url.Parse(c.URL("postgres"))
	old.Host = now.Host
	if conn, err := pgx.Connect(ctx, old.String()); err == nil {
		conn.Close(ctx)
		t.Fatal("the first password still opens the cluster")
	}
	if conn, err = pgx.Connect(ctx, now.String()); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	for _, bad := range []string{" padded", "two\nlines"} {
		if _, err := embedded.Start(ctx, embedded.Options{Password: bad}); err == nil || !strings.Contains(err.Error(), "Password") {
			t.Errorf("Password %q: %v, want an error naming Password", bad, err)
		}
	}
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

// BenchmarkStart is a new ephemeral cluster's start, until it accepts connections, copied from
// the template and made by initdb (docs/benchmarks.md, "Cold start"). Stopping is not timed.
func BenchmarkStart(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts embedded.Options
	}{
		{"template", embedded.Options{TemplateDir: b.TempDir()}},
		{"initdb", embedded.Options{NoTemplate: true}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			c, err := embedded.Start(ctx, bc.opts) // the template, made outside the timing
			if err != nil {
				b.Fatal(err)
			}
			_ = c.Stop(ctx)
			b.ResetTimer()
			for b.Loop() {
				c, err := embedded.Start(ctx, bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := c.Stop(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/start")
		})
	}
}

// TestPrepareIsInEveryCopy: what Prepare makes (the devserver's migrations) is made once, kept in
// the template, and found in every cluster copied from it; another PrepareKey makes another
// template and replaces the first; a failing Prepare keeps nothing.
func TestPrepareIsInEveryCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cache := t.TempDir()
	calls := 0
	prepare := func(ctx context.Context, url string) error {
		calls++
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE TABLE prepared (x int); INSERT INTO prepared VALUES (7)")
		return err
	}
	prepared := func(c *embedded.Cluster) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var x int
		if err := conn.QueryRow(ctx, "SELECT x FROM prepared").Scan(&x); err != nil || x != 7 {
			t.Fatalf("what Prepare made: %d, %v", x, err)
		}
	}
	for i := range 2 {
		prepared(startIn(t, embedded.Options{TemplateDir: cache, Prepare: prepare, PrepareKey: "v1"}))
		if calls != 1 {
			t.Fatalf("after %d starts Prepare ran %d times, want once", i+1, calls)
		}
	}
	first := templates(t, cache)
	prepared(startIn(t, embedded.Options{TemplateDir: cache, Prepare: prepare, PrepareKey: "v2"}))
	if now := templates(t, cache); calls != 2 || len(now) != 2 {
		t.Fatalf("another PrepareKey: Prepare ran %d times, the cache holds %v; want twice and both templates (both in use)", calls, now)
	}
	// A template unused for two days goes when another of its family is made.
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(cache, first[0]), old, old); err != nil {
		t.Fatal(err)
	}
	prepared(startIn(t, embedded.Options{TemplateDir: cache, Prepare: prepare, PrepareKey: "v3"}))
	if now := templates(t, cache); calls != 3 || len(now) != 2 || slices.Contains(now, first[0]) {
		t.Fatalf("a third PrepareKey: Prepare ran %d times, the cache holds %v; want the unused %s gone", calls, now, first[0])
	}
	broken := errors.New("broken migration")
	_, err := embedded.Start(ctx, embedded.Options{TemplateDir: cache, PrepareKey: "v4", Prepare: func(context.Context, string) error { return broken }})
	if !errors.Is(err, broken) {
		t.Fatalf("a failing Prepare: %v", err)
	}
	if now := templates(t, cache); len(now) != 2 {
		t.Fatalf("a failing Prepare left %v in the cache", now)
	}
	if _, err := embedded.Start(ctx, embedded.Options{Prepare: prepare}); err == nil || !strings.Contains(err.Error(), "PrepareKey") {
		t.Fatalf("Prepare without PrepareKey: %v, want an error naming PrepareKey", err)
	}
}

// TestBrokenTemplateFallsBackToInitdb: a template that cannot be copied (here it holds a
// symbolic link, which no data directory has) is passed over for initdb, not a failed start.
func TestBrokenTemplateFallsBackToInitdb(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	startIn(t, embedded.Options{TemplateDir: cache})
	tpl := filepath.Join(cache, templates(t, cache)[0])
	if err := os.Symlink("/nowhere", filepath.Join(tpl, "a-link")); err != nil {
		t.Fatal(err)
	}
	c := startIn(t, embedded.Options{TemplateDir: cache})
	conn, err := pgx.Connect(context.Background(), c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	// The broken template was replaced by the cluster initdb made.
	if names := templates(t, cache); len(names) != 1 {
		t.Fatalf("the cache holds %v, want one template", names)
	}
	if _, err := os.Lstat(filepath.Join(cache, templates(t, cache)[0], "a-link")); !os.IsNotExist(err) {
		t.Fatalf("the broken template is still kept: %v", err)
	}
}

// TestFailedFirstStartKeepsNoTemplatePassword: a DataDir copied from the template whose first
// start failed (its port taken) holds the template's password until a start gives it its own;
// the next start must, rather than keep the password the template, and every other copy that
// failed the same way, shares.
func TestFailedFirstStartKeepsNoTemplatePassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cache := t.TempDir()
	startIn(t, embedded.Options{TemplateDir: cache}) // makes the template
	tplPassword, err := os.ReadFile(filepath.Join(cache, templates(t, cache)[0], "better-compute.password"))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	parent, err := os.MkdirTemp("", "embedded-test-") // not t.TempDir: see TestDataDirSurvivesRestart
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "pg")
	if _, err := embedded.Start(ctx, embedded.Options{TemplateDir: cache, DataDir: dir, Port: taken.Addr().(*net.TCPAddr).Port,
		StartTimeout: 3 * time.Second}); err == nil {
		t.Fatal("a start on a taken port succeeded")
	}
	c := startIn(t, embedded.Options{TemplateDir: cache, DataDir: dir})
	if got := password(t, c); got == strings.TrimSpace(string(tplPassword)) {
		t.Fatalf("the cluster in %s kept the template's password", dir)
	}
}

// TestTemplateOthersCanWriteIsNotCopied: a template that others may write to (in a TemplateDir
// shared between users, one could be planted) is not copied: its roles and data would be in the
// cluster. A cluster is then made by initdb.
func TestTemplateOthersCanWriteIsNotCopied(t *testing.T) {
	t.Parallel()
	cache := t.TempDir()
	startIn(t, embedded.Options{TemplateDir: cache})
	tpl := filepath.Join(cache, templates(t, cache)[0])
	if err := os.WriteFile(filepath.Join(tpl, "planted"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tpl, 0o777); err != nil {
		t.Fatal(err)
	}
	c := startIn(t, embedded.Options{TemplateDir: cache})
	if _, err := os.Stat(filepath.Join(c.DataDir(), "planted")); err == nil {
		t.Fatal("the cluster was copied from a template others may write to")
	}
}
