package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/sim"
	"github.com/better-compute/compute/vps"
)

func signals() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func logger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// verboseShorthand keeps -v as a deprecated shorthand of --verbose: -v is the version on the
// root command, and is to mean only that.
func verboseShorthand(c *cobra.Command, verbose *bool) {
	f := c.Flags()
	f.BoolVarP(verbose, "verbose-v", "v", false, "debug logs")
	_ = f.MarkHidden("verbose-v")
	_ = f.MarkShorthandDeprecated("verbose-v", "use --verbose")
}

func devCmd() *cobra.Command {
	o := devserver.Options{}
	var verbose bool
	c := &cobra.Command{
		Use:   "dev",
		Short: "Run the development server: the whole control plane on an embedded PostgreSQL",
		Long: `dev runs every process mode in one process on a private PostgreSQL (or $BETTER_COMPUTE_DATABASE_URL),
on loopback addresses, prints the API's URL, an API key with every right and the database's URL, and
with --sim N joins N simulated machines with 8 GPUs each into the pool "gpu"; it prints all this only
once their GPUs are counted and schedulable, so a first reservation can use them. With --data-dir the
database, the secret and the key outlive a restart. Ctrl-C stops it.

Its flags are go run ./examples/devserver's; --listen, --gateway-listen, --verbose and
--allow-private-webhooks are serve's too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signals()
			defer stop()
			o.Logger = logger(cmd.ErrOrStderr(), verbose)
			o.Modules = func(url string) ([]compute.Module, error) {
				m, err := metal.New(metal.Options{JoinURL: url})
				if err != nil {
					return nil, err
				}
				v, err := vps.New(vps.Options{})
				return []compute.Module{m, v}, err
			}
			s, err := devserver.Start(ctx, o)
			if errors.Is(err, devserver.ErrEmbeddedOnly) {
				return usageError{Err: err}
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			s.Describe(out)
			if o.Sim > 0 {
				fmt.Fprintf(out, "  Nodes:    %d simulated machines with %d H100s each, in pool %q, schedulable\n", o.Sim, devserver.SimGPUs, devserver.SimPool)
			}
			fmt.Fprintf(out, "\nexport BETTER_COMPUTE_URL=%s BETTER_COMPUTE_API_KEY=%s\n", s.URL, s.APIKey)
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			return s.Stop(sctx)
		},
	}
	o.Flags(c.Flags(), &verbose)
	for old, now := range devserver.Deprecated {
		_ = c.Flags().MarkDeprecated(old, "use --"+now)
	}
	verboseShorthand(c, &verbose)
	return c
}

// serveConfig is the control plane's configuration: flags, then the environment, then a config file.
type serveConfig struct {
	Mode           string   `json:"mode"`
	DatabaseURL    string   `json:"databaseUrl"`
	Secret         string   `json:"secret"`
	RootTenant     string   `json:"rootTenant"`
	BaseURL        string   `json:"baseUrl"`
	Listen         string   `json:"listen"`
	GatewayListen  string   `json:"gatewayListen"`
	GatewayHosts   []string `json:"gatewayHosts"`
	GatewayAddress []string `json:"gatewayAddresses"`
	// AllowPrivateWebhooks is for development only, and taken only with IKnowItIsUnsafe: flags
	// alone, never a config file a deployment may carry along.
	AllowPrivateWebhooks bool `json:"-"`
	IKnowItIsUnsafe      bool `json:"-"`
}

func serveCmd() *cobra.Command {
	cfg := serveConfig{Mode: "all", RootTenant: "root", Listen: devserver.DefaultListen, GatewayListen: devserver.DefaultGatewayListen}
	var configPath string
	var verbose bool
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the control plane for real, in one process mode or all",
		Long: `serve runs the control plane on a PostgreSQL database, with Better IAM in-process on the same database.

  --mode api       the public API and JoinService, on --listen
  --mode gateway   node sessions, over mutual TLS on --gateway-listen
  --mode worker    reconcilers: reservation lifecycle, billing, command deadlines, offline nodes
  --mode all       all of it

Both addresses are loopback ones unless given: --listen :8080 --gateway-listen :8443 listen on every
interface, for other machines (nodes dial the gateway). Processes of different modes on one database
work together. Every mode serves /healthz (alive), /readyz (initialized, database answering) and
/metrics (Prometheus) on --listen. SIGTERM stops it gracefully.

--allow-private-webhooks (webhooks to loopback and private addresses) is for development, as in
better-compute dev; serve takes it only with --i-know-it-is-unsafe.

Settings: flags, then $BETTER_COMPUTE_DATABASE_URL, $BETTER_COMPUTE_SECRET, $BETTER_COMPUTE_MODE,
$BETTER_COMPUTE_ROOT_TENANT, $BETTER_COMPUTE_BASE_URL, then --config (JSON: mode, databaseUrl, secret,
rootTenant, baseUrl, listen, gatewayListen, gatewayHosts, gatewayAddresses).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.fill(cmd, configPath); err != nil {
				return err
			}
			ctx, stop := signals()
			defer stop()
			return serve(ctx, cfg, logger(cmd.ErrOrStderr(), verbose), cmd.OutOrStdout())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Mode, "mode", cfg.Mode, "api, gateway, worker or all")
	f.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL URL ($BETTER_COMPUTE_DATABASE_URL)")
	f.StringVar(&cfg.Secret, "secret", "", "the control plane's secret, 32 characters or more ($BETTER_COMPUTE_SECRET)")
	f.StringVar(&cfg.RootTenant, "root-tenant", cfg.RootTenant, "the IAM root tenant ($BETTER_COMPUTE_ROOT_TENANT)")
	f.StringVar(&cfg.BaseURL, "base-url", "", "the API's public URL ($BETTER_COMPUTE_BASE_URL; default from --listen)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "the API's address (and health endpoints')")
	f.StringVar(&cfg.GatewayListen, "gateway-listen", cfg.GatewayListen, "node sessions' address (gateway and all modes)")
	f.StringSliceVar(&cfg.GatewayHosts, "gateway-hosts", nil, "names and addresses nodes dial the gateway by, for its certificate (default: this host's name, localhost, 127.0.0.1)")
	f.StringSliceVar(&cfg.GatewayAddress, "gateway-address", nil, "gateway host:port handed to joining nodes")
	f.StringVar(&configPath, "config", "", "config file")
	f.BoolVar(&verbose, "verbose", false, "debug logs")
	f.BoolVar(&cfg.AllowPrivateWebhooks, "allow-private-webhooks", false, "let webhooks reach loopback and private addresses: for development only, and taken only with --i-know-it-is-unsafe")
	f.BoolVar(&cfg.IKnowItIsUnsafe, "i-know-it-is-unsafe", false, "take --allow-private-webhooks: any tenant's webhooks may then reach this host and its network")
	verboseShorthand(c, &verbose)
	return c
}

func (cfg *serveConfig) fill(cmd *cobra.Command, path string) error {
	var file serveConfig
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		if err := json.Unmarshal(b, &file); err != nil {
			return fmt.Errorf("config %s: %w", path, err)
		}
	}
	pick := func(flag, env, fromFile string, dst *string) {
		if cmd.Flags().Changed(flag) {
			return
		}
		if v := os.Getenv(env); v != "" && env != "" {
			*dst = v
		} else if fromFile != "" {
			*dst = fromFile
		}
	}
	pick("mode", "BETTER_COMPUTE_MODE", file.Mode, &cfg.Mode)
	pick("database-url", postgres.EnvDatabaseURL, file.DatabaseURL, &cfg.DatabaseURL)
	pick("secret", "BETTER_COMPUTE_SECRET", file.Secret, &cfg.Secret)
	pick("root-tenant", "BETTER_COMPUTE_ROOT_TENANT", file.RootTenant, &cfg.RootTenant)
	pick("base-url", "BETTER_COMPUTE_BASE_URL", file.BaseURL, &cfg.BaseURL)
	pick("listen", "", file.Listen, &cfg.Listen)
	pick("gateway-listen", "", file.GatewayListen, &cfg.GatewayListen)
	if !cmd.Flags().Changed("gateway-hosts") && len(file.GatewayHosts) > 0 {
		cfg.GatewayHosts = file.GatewayHosts
	}
	if !cmd.Flags().Changed("gateway-address") && len(file.GatewayAddress) > 0 {
		cfg.GatewayAddress = file.GatewayAddress
	}
	if cfg.DatabaseURL == "" {
		return usageError{Err: errors.New("serve needs a database: --database-url or $BETTER_COMPUTE_DATABASE_URL")}
	}
	if cfg.Secret == "" {
		return usageError{Err: errors.New("serve needs a secret: --secret or $BETTER_COMPUTE_SECRET (32 characters or more)")}
	}
	if cfg.AllowPrivateWebhooks && !cfg.IKnowItIsUnsafe {
		return usageError{Err: errors.New("--allow-private-webhooks lets every tenant's webhooks reach this host and its network (loopback, private addresses, cloud metadata): it is for development (better-compute dev has it); to run serve with it anyway, add --i-know-it-is-unsafe")}
	}
	return nil
}

func serve(ctx context.Context, cfg serveConfig, log *slog.Logger, out io.Writer) error {
	mode := compute.Mode(cfg.Mode)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	if cfg.BaseURL == "" {
		cfg.BaseURL = "http://" + ln.Addr().String()
	}
	db, err := postgres.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	port, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: cfg.RootTenant})
	if err != nil {
		return err
	}
	mt, err := metal.New(metal.Options{JoinURL: cfg.BaseURL})
	if err != nil {
		return err
	}
	vm, err := vps.New(vps.Options{})
	if err != nil {
		return err
	}
	c, err := compute.New(compute.Options{Database: db, Secret: cfg.Secret, BaseURL: cfg.BaseURL, RootTenantID: cfg.RootTenant,
		IAM: port, Mode: mode, Logger: log, GatewayAddresses: cfg.GatewayAddress, Modules: []compute.Module{mt, vm},
		Webhooks: compute.WebhookOptions{AllowPrivateTargets: cfg.AllowPrivateWebhooks}})
	if err != nil {
		return err
	}
	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() || db.Pool.Ping(r.Context()) != nil {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	mux.Handle("/metrics", c.MetricsHandler) // every mode: each process has its own series
	if mode == compute.ModeAPI || mode == compute.ModeAll {
		mux.Handle("/api/compute/", c.Handler)
		mux.Handle("/"+compute.JoinPath, c.JoinHandler)
		mux.Handle(compute.ConsolePath, c.ConsoleHandler) // the web console: every call through the API above
	}
	// Every route here is a bounded request and answer: a slow body or a slow reader is cut off.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // health answers while Initialize runs
	if err := c.Initialize(ctx); err != nil {
		_ = srv.Close()
		return err
	}
	if err := c.Start(ctx); err != nil {
		_ = srv.Close()
		return err
	}
	var gw *http.Server
	var gwAddr net.Addr
	gwServed := make(chan error, 1)
	if mode == compute.ModeGateway || mode == compute.ModeAll {
		hosts := cfg.GatewayHosts
		if len(hosts) == 0 {
			h, _ := os.Hostname()
			hosts = []string{h, "localhost", "127.0.0.1"}
		}
		tlsCfg, err := c.GatewayTLS(ctx, hosts...)
		if err != nil {
			return err
		}
		gln, err := net.Listen("tcp", cfg.GatewayListen)
		if err != nil {
			return fmt.Errorf("listen for node sessions on %s: %w", cfg.GatewayListen, err)
		}
		// Node sessions are long-lived streams: no read or write deadline, only idle connections end.
		gw = &http.Server{Handler: c.NodeHandler, TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		gwAddr = gln.Addr()
		go func() { gwServed <- gw.ServeTLS(gln, "", "") }()
		fmt.Fprintf(out, "better-compute: gateway on %s (hosts %s)\n", gln.Addr(), strings.Join(hosts, ", "))
	}
	ready.Store(true)
	if cfg.AllowPrivateWebhooks {
		fmt.Fprintln(out, "better-compute: webhooks may reach loopback and private addresses (--allow-private-webhooks): for development only")
	}
	if local := loopbackOnly(map[string]net.Addr{"--listen": ln.Addr(), "--gateway-listen": gwAddr}); local != "" {
		fmt.Fprintf(out, "better-compute: loopback only, out of other machines' reach: %s (:PORT listens on every interface)\n", local)
	}
	fmt.Fprintf(out, "better-compute: serving, mode %s, on %s\n", mode, ln.Addr())
	if mode == compute.ModeAPI || mode == compute.ModeAll {
		fmt.Fprintf(out, "better-compute: console at %s%s\n", strings.TrimSuffix(cfg.BaseURL, "/"), compute.ConsolePath)
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	log.Info("better-compute: stopping")
	ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := []error{srv.Shutdown(sctx)}
	// The gateway stops before its connections close: it says goodbye, and its nodes reconnect
	// elsewhere within their grace. Connections closed under a running gateway are nodes leaving,
	// which it takes offline at once.
	errs = append(errs, c.Stop(sctx))
	if gw != nil {
		errs = append(errs, gw.Close())
	}
	return errors.Join(errs...)
}

// loopbackOnly names the flags whose addresses are loopback ones, as "--listen 127.0.0.1:8080".
func loopbackOnly(addrs map[string]net.Addr) string {
	var local []string
	for _, flag := range []string{"--listen", "--gateway-listen"} {
		if a, ok := addrs[flag].(*net.TCPAddr); ok && a.IP.IsLoopback() {
			local = append(local, flag+" "+a.String())
		}
	}
	return strings.Join(local, " and ")
}

func simCmd(p *profile) *cobra.Command {
	o := sim.Options{Version: version}
	c := &cobra.Command{
		Use:   "sim --nodes N --server URL --token TOKEN",
		Short: "Join N simulated machines to a running control plane and hold their sessions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.URL = p.URL
			if o.URL == "" || o.Token == "" || o.Nodes <= 0 {
				return usageError{Err: errors.New("sim needs --nodes, --server (or $BETTER_COMPUTE_URL) and --token (a join token with at least N uses)")}
			}
			ctx, stop := signals()
			defer stop()
			f, err := sim.Start(ctx, o)
			if err != nil {
				return err
			}
			defer f.Stop()
			wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err = f.WaitConnected(wctx)
			cancel()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sim: %d nodes connected; Ctrl-C stops them\n", o.Nodes)
			<-ctx.Done()
			return nil
		},
	}
	c.Flags().IntVar(&o.Nodes, "nodes", 0, "how many machines")
	c.Flags().StringVar(&o.Token, "token", "", "a join token with at least --nodes uses")
	c.Flags().StringVar(&o.Gateway, "gateway", "", "gateway host:port (default: what the joins gave)")
	c.Flags().IntVar(&o.GPUs, "gpus", 8, "GPUs per machine")
	c.Flags().StringVar(&o.Prefix, "prefix", "sim", "node names are <prefix>-<n>")
	return c
}
