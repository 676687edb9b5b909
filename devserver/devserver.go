// Package devserver runs the whole control plane for development: an embedded PostgreSQL (or the
// server BETTER_COMPUTE_DATABASE_URL names), the embedded IAM, every process mode in one process,
// and the API on a loopback address. examples/devserver and `better-compute dev` are thin mains
// over it, with the same flags (Flags).
package devserver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/sim"
)

// RootTenantID is the devserver's root tenant.
const RootTenantID = "root"

// Options configure a devserver.
type Options struct {
	Addr        string // the API's listen address (--listen); default DefaultListen
	GatewayAddr string // node sessions' (mutual TLS; --gateway-listen); default DefaultGatewayListen
	DataDir     string // keep the database here across restarts; empty: a temporary one
	Logger      *slog.Logger
	// HeartbeatInterval fixes what nodes are asked for; 0: the gateway's default.
	HeartbeatInterval time.Duration
	// Sim joins this many simulated GPU machines (8 H100s each) into the pool SimPool at start.
	Sim int
	// Modules, if set, makes the modules the control plane runs with, given its API's URL
	// (the metal module's JoinURL): a main passes them, since nothing under internal/ imports
	// a module.
	Modules func(url string) ([]compute.Module, error)
	// PostgresPort and PostgresPassword choose the embedded PostgreSQL's loopback port (0: a free
	// one) and its superuser's password (empty: the one kept in DataDir, or a new one). They
	// are refused when BETTER_COMPUTE_DATABASE_URL names another server.
	PostgresPort     int
	PostgresPassword string
	// Embedded starts a private embedded PostgreSQL even where BETTER_COMPUTE_DATABASE_URL names a
	// server: for programs (examples, tests) whose writes must not land in a shared database.
	Embedded bool
	// AllowPrivateWebhooks lets webhook endpoints be loopback and private addresses, to try
	// webhooks with a receiver on this machine (compute.WebhookOptions.AllowPrivateTargets). For
	// development only: every tenant's endpoints may then reach this host and its network.
	AllowPrivateWebhooks bool
}

// SimPool is the pool simulated machines join.
const SimPool = "gpu"

// SimGPUs is the GPUs of each simulated machine.
const SimGPUs = 8

// Server is a running devserver.
type Server struct {
	URL     string // the API's base URL, e.g. http://127.0.0.1:8080
	Console string // the web console's URL: URL + compute.ConsolePath
	Gateway string // where nodes hold their sessions, host:port
	APIKey  string // a key with every right in the root tenant
	// APIKeyFile keeps APIKey across restarts, in DataDir; empty without one (a new key then).
	APIKeyFile string
	// Database is the PostgreSQL URL, with its password (the embedded server's superuser's, or
	// BETTER_COMPUTE_DATABASE_URL's); DatabaseFromEnv says it is the latter.
	Database        string
	DatabaseFromEnv bool
	// PrivateWebhooks is Options.AllowPrivateWebhooks.
	PrivateWebhooks bool

	Compute *compute.Compute
	IAM     *iam.Local
	DB      *postgres.DB

	http     *http.Server
	gw       *http.Server
	fleet    *sim.Fleet
	stopDB   func(context.Context) error
	served   chan error
	gwServed chan error
	logger   *slog.Logger
	listener net.Listener
	stopOnce sync.Once
	stopErr  error
}

// Start brings a devserver up and returns once it answers. Its errors say "devserver: " once.
func Start(ctx context.Context, o Options) (*Server, error) {
	s, err := start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("devserver: %w", err)
	}
	return s, nil
}

func start(ctx context.Context, o Options) (_ *Server, err error) {
	o.Addr = cmp.Or(o.Addr, DefaultListen)
	o.GatewayAddr = cmp.Or(o.GatewayAddr, DefaultGatewayListen)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{logger: o.Logger, served: make(chan error, 1), gwServed: make(chan error, 1), PrivateWebhooks: o.AllowPrivateWebhooks}
	defer func() {
		if err != nil {
			s.Stop(context.Background())
		}
	}()
	secret, err := loadSecret(o.DataDir)
	if err != nil {
		return nil, err
	}
	if err := s.database(ctx, o); err != nil {
		return nil, err
	}
	if s.DB, err = postgres.Open(ctx, s.Database); err != nil {
		return nil, err
	}
	if s.IAM, err = iam.Embedded(s.DB, iam.EmbeddedOptions{RootTenantID: RootTenantID}); err != nil {
		return nil, err
	}
	if s.listener, err = net.Listen("tcp", o.Addr); err != nil {
		return nil, fmt.Errorf("the API's address (--listen): %w", err)
	}
	s.URL = "http://" + s.listener.Addr().String()
	s.Console = s.URL + compute.ConsolePath
	gwListener, err := net.Listen("tcp", o.GatewayAddr)
	if err != nil {
		s.listener.Close()
		return nil, fmt.Errorf("the node sessions' address (--gateway-listen): %w", err)
	}
	defer func() {
		if s.gw == nil {
			gwListener.Close() // not served: nothing else closes it
		}
	}()
	s.Gateway = gwListener.Addr().String()
	var mods []compute.Module
	if o.Modules != nil {
		if mods, err = o.Modules(s.URL); err != nil {
			return nil, err
		}
	}
	s.Compute, err = compute.New(compute.Options{
		Database: s.DB, Secret: secret, BaseURL: s.URL, RootTenantID: RootTenantID, IAM: s.IAM,
		Mode: compute.ModeAll, Logger: o.Logger, GatewayAddresses: []string{s.Gateway},
		HeartbeatInterval: o.HeartbeatInterval, Modules: mods,
		Webhooks: compute.WebhookOptions{AllowPrivateTargets: o.AllowPrivateWebhooks},
	})
	if err != nil {
		return nil, err
	}
	if err := s.Compute.Initialize(ctx); err != nil {
		return nil, err
	}
	if err := s.adminKey(ctx, o.DataDir); err != nil {
		return nil, err
	}
	if o.AllowPrivateWebhooks {
		o.Logger.Warn("webhooks may reach loopback and private addresses: for development only")
	}
	if err := s.Compute.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(s.Gateway)
	tlsCfg, err := s.Compute.GatewayTLS(ctx, host, "localhost")
	if err != nil {
		return nil, err
	}
	// Node sessions are long-lived streams: no read or write deadline, only idle connections end.
	s.gw = &http.Server{Handler: s.Compute.NodeHandler, TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { s.gwServed <- s.gw.ServeTLS(gwListener, "", "") }()
	mux := http.NewServeMux()
	mux.Handle("/api/compute/", s.Compute.Handler)
	mux.Handle("/"+compute.JoinPath, s.Compute.JoinHandler)
	mux.Handle("/metrics", s.Compute.MetricsHandler)
	mux.Handle(compute.ConsolePath, s.Compute.ConsoleHandler)
	mux.Handle("GET /{$}", http.RedirectHandler(compute.ConsolePath, http.StatusFound))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// Every route here is a bounded request and answer: a slow body or a slow reader is cut off.
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { s.served <- s.http.Serve(s.listener) }()
	if o.Sim > 0 {
		if err := s.simulate(ctx, o.Sim); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// simulate joins n simulated machines into SimPool (made if missing) and waits until they are
// schedulable: their sessions up and their GPUs counted.
func (s *Server) simulate(ctx context.Context, n int) error {
	a := s.Compute.API
	if _, err := a.Pools.Create(ctx, s.APIKey, api.CreatePool{Name: SimPool, Description: "simulated GPU machines"}); err != nil && api.CodeOf(err) != api.CodeConflict {
		return err
	}
	tok, err := a.JoinTokens.Create(ctx, s.APIKey, api.CreateJoinToken{Pool: SimPool, MaxUses: n, TTL: "1h", Description: "devserver --sim"})
	if err != nil {
		return err
	}
	s.fleet, err = sim.Start(context.WithoutCancel(ctx), sim.Options{URL: s.URL, Token: tok.Token, Nodes: n, GPUs: SimGPUs, Logger: s.logger})
	if err != nil {
		return fmt.Errorf("simulated nodes: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := s.fleet.WaitConnected(wctx); err != nil {
		return err
	}
	return s.waitSchedulable(wctx, s.fleet, SimGPUs)
}

// Stop shuts everything down in order: the API's HTTP, background work (the gateway says goodbye
// to its sessions), the gateway's connections, the pool, the database. A second call answers
// what the first did.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		if err := s.stop(ctx); err != nil {
			s.stopErr = fmt.Errorf("devserver: stop: %w", err)
		}
	})
	return s.stopErr
}

func (s *Server) stop(ctx context.Context) error {
	var errs []error
	if s.fleet != nil {
		s.fleet.Stop()
	}
	if s.http != nil {
		errs = append(errs, s.http.Shutdown(ctx))
		if err := <-s.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	} else if s.listener != nil {
		s.listener.Close()
	}
	// The gateway stops before its connections close, so that its nodes are not taken for gone
	// (offline at once) but reconnect within their grace.
	if s.Compute != nil {
		errs = append(errs, s.Compute.Stop(ctx))
	}
	if s.gw != nil {
		// Sessions are long-lived streams: close them rather than wait for them to finish.
		errs = append(errs, s.gw.Close())
		if err := <-s.gwServed; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if s.DB != nil {
		s.DB.Close()
	}
	if s.stopDB != nil {
		errs = append(errs, s.stopDB(ctx))
	}
	return errors.Join(errs...)
}

func pgDir(dataDir string) string {
	if dataDir == "" {
		return ""
	}
	return filepath.Join(dataDir, "postgres")
}

// loadSecret returns BETTER_COMPUTE_SECRET, or the secret kept in dataDir (made on first use),
// or a new one for a temporary devserver.
func loadSecret(dataDir string) (string, error) {
	if s := os.Getenv("BETTER_COMPUTE_SECRET"); s != "" {
		return s, nil
	}
	newSecret := func() string {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	if dataDir == "" {
		return newSecret(), nil
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(dataDir, "secret")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read the secret: %w", err)
	}
	s := newSecret()
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keep the secret: %w", err)
	}
	return s, nil
}
