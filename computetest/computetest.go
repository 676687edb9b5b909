// Package computetest gives a test a whole control plane: a fresh database (postgres/pgtest),
// the embedded IAM with a root administrator key, and an initialized Compute. Host applications
// that embed Better Compute can use it in their own tests.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestReserve(t *testing.T) {
//		env := computetest.New(t, computetest.Options{})
//		pool, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"})
//		...
//	}
package computetest

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/iam/iamtest"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// RootTenantID is the root tenant of every test control plane.
const RootTenantID = "root"

// Loopback are the ranges test control planes let tenants' URLs reach (Options.Outbound.Allow).
var Loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// Secret is the test control planes' secret.
const Secret = "computetest-secret-0123456789abcdef"

// Options change the test control plane.
type Options struct {
	Modules []compute.Module
	Mode    compute.Mode
	// Configure may change the compute options before New. They allow loopback outbound
	// (Outbound.Allow is Loopback), where a test's receivers, fakes and BMC simulators listen;
	// a test of the outbound policy sets Outbound itself.
	Configure func(*compute.Options)
	// MaxConns, when set, is the size of the connection pool that Compute and the embedded IAM
	// share (16 otherwise): a small pool shows a path that holds a connection while it waits for
	// another.
	MaxConns int32
}

// Env is a running test control plane.
type Env struct {
	DB      *postgres.DB
	IAM     *iam.Local
	Counter *iamtest.Counting // wraps IAM; the port Compute was given
	Compute *compute.Compute
	// RootKey is an API key with every right in the root tenant.
	RootKey string
}

// New builds and initializes a control plane on a fresh database. Its background work is not
// started; call env.Compute.Start when a test needs it.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	ctx := context.Background()
	sets, err := compute.MigrationSets(opts.Modules...)
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	db := pgtest.New(t, append(sets, iam.Migrations)...)
	if opts.MaxConns > 0 {
		cfg := db.Pool.Config().Copy()
		cfg.MaxConns = opts.MaxConns
		if db, err = postgres.OpenConfig(ctx, cfg); err != nil {
			t.Fatalf("computetest: %v", err)
		}
		t.Cleanup(db.Close)
	}
	local, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: RootTenantID})
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	counter := iamtest.NewCounting(local)
	o := compute.Options{
		Database: db, Secret: Secret, BaseURL: "http://compute.test", RootTenantID: RootTenantID,
		IAM: counter, Modules: opts.Modules, Mode: opts.Mode, Logger: testLogger(t),
		Outbound: compute.OutboundOptions{Allow: Loopback},
	}
	if opts.Configure != nil {
		opts.Configure(&o)
	}
	c, err := compute.New(o)
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	if err := c.Initialize(ctx); err != nil {
		t.Fatalf("computetest: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	key, err := local.CreateAdminKey(ctx, RootTenantID, "computetest-root")
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	counter.Reset()
	return &Env{DB: db, IAM: local, Counter: counter, Compute: c, RootKey: key.Token}
}

// Tenant creates a tenant under the root and returns its id and an administrator key for it.
func (e *Env) Tenant(t testing.TB, name string) (tenantID, key string) {
	t.Helper()
	ctx := context.Background()
	ten, err := e.IAM.CreateTenant(ctx, iam.CreateTenant{ID: name, ParentID: RootTenantID, Name: name})
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	k, err := e.IAM.CreateAdminKey(ctx, ten.ID, name+"-admin")
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	return ten.ID, k.Token
}

// Server serves the API, JoinService, /metrics and the console over real HTTP on loopback for the rest of the
// test, and returns its URL.
func (e *Env) Server(t testing.TB) string {
	t.Helper()
	return e.Serve(t, Listener(t))
}

// Listener reserves a loopback listener for Serve: a test that must know the API's URL before it
// builds the control plane (a module configured with it) takes one first.
func Listener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	return ln
}

// Serve serves the API, JoinService, /metrics and the console on ln for the rest of the test, and returns
// its URL.
func (e *Env) Serve(t testing.TB, ln net.Listener) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/api/compute/", e.Compute.Handler)
	mux.Handle("/"+compute.JoinPath, e.Compute.JoinHandler)
	mux.Handle("/metrics", e.Compute.MetricsHandler)
	mux.Handle(compute.ConsolePath, e.Compute.ConsoleHandler)
	s := httptest.NewUnstartedServer(mux)
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s.URL
}

// Gateway starts the control plane's background work and serves node sessions on a TLS
// listener on loopback (addr, or a free port when empty), until the test ends or stop is called.
// It returns the address nodes dial.
func (e *Env) Gateway(t testing.TB, addr string) (gatewayAddr string, stop func()) {
	t.Helper()
	ctx := context.Background()
	if err := e.Compute.Start(ctx); err != nil {
		t.Fatalf("computetest: %v", err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	for range 50 { // a restarted gateway may wait a moment for its old port
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("computetest: gateway listener: %v", err)
	}
	hosts := []string{"127.0.0.1", "localhost"}
	if h, _, err := net.SplitHostPort(addr); err == nil && h != "127.0.0.1" && h != "" {
		hosts = append(hosts, h) // a gateway on another address (a test's network namespace) is named in its certificate
	}
	cfg, err := e.Compute.GatewayTLS(ctx, hosts...)
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	srv := &http.Server{Handler: e.Compute.NodeHandler, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // refused handshakes are what some tests are about
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "")
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_ = e.Compute.Stop(sctx)
			_ = srv.Close()
			<-done
		})
	}
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// Attach builds a second control plane on env's database, as another process would have: its own
// Compute (and gateway), the same IAM.
func Attach(t testing.TB, env *Env, opts Options) *Env {
	t.Helper()
	o := compute.Options{
		Database: env.DB, Secret: Secret, BaseURL: "http://compute.test", RootTenantID: RootTenantID,
		IAM: env.Counter, Modules: opts.Modules, Mode: opts.Mode, Logger: testLogger(t),
		Outbound: compute.OutboundOptions{Allow: Loopback},
	}
	if opts.Configure != nil {
		opts.Configure(&o)
	}
	c, err := compute.New(o)
	if err != nil {
		t.Fatalf("computetest: %v", err)
	}
	if err := c.Initialize(context.Background()); err != nil {
		t.Fatalf("computetest: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	other := *env
	other.Compute = c
	return &other
}

// testLogger discards logs, or with -v writes them to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
