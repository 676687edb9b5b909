// Package compute is Better Compute, an embeddable control plane for GPU, CPU and sandbox
// capacity. A host application calls New with its PostgreSQL database, an IAM port and the
// modules it wants, and mounts what it gets back:
//
//	c, err := compute.New(compute.Options{Database: db, Secret: secret, BaseURL: url,
//		RootTenantID: root, IAM: port})
//	err = c.Initialize(ctx)                 // migrations, IAM catalog, module start
//	mux.Handle("/api/compute/", c.Handler)  // the public API
//	err = c.Start(ctx); defer c.Stop(ctx)   // background work of the process mode
//
// Where to start: Options says what New needs and what each default is; c.API calls every
// method in-process, typed, with a …Tx twin of each mutation for the host's own transaction
// (InvokeTx); a module (package modules) adds methods, tables and node-side kinds of its own.
// docs/architecture.md maps every package of the module and its layer.
package compute

//go:generate go run ./internal/tools/cmd/apigen

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/console"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/access"
	"github.com/better-compute/compute/internal/core/audit"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/events/stream"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/fleetconfig"
	"github.com/better-compute/compute/internal/core/gateway"
	"github.com/better-compute/compute/internal/core/metrics"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/core/quorum"
	"github.com/better-compute/compute/internal/core/releases"
	"github.com/better-compute/compute/internal/core/rollouts"
	"github.com/better-compute/compute/internal/core/webhooks"
	"github.com/better-compute/compute/internal/core/workflow"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/jointokens"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Compute is a control plane. Its fields are ready after New; they answer unavailable until
// Initialize has succeeded.
type Compute struct {
	// API is the typed in-process API: c.API.Pools.Create(ctx, credential, in).
	API *API
	// Handler serves the public API: POST /api/compute/{group}/{method}.
	Handler http.Handler
	// NodeHandler serves the node protocol's sessions (gRPC, through Connect) to bcd. Serve it
	// over TLS configured by GatewayTLS: nodes are known by their client certificates.
	NodeHandler http.Handler
	// JoinHandler serves JoinService: nodes trade a join token for a certificate. Mount it at
	// JoinPath beside the API.
	JoinHandler http.Handler
	// MetricsHandler serves this control plane's Prometheus metrics (text format) from a
	// registry of its own; mount it at /metrics. docs/events.md lists the series.
	MetricsHandler http.Handler
	// ConsoleHandler serves the web console, a page from assets embedded in the binary that
	// calls the public API with the signed-in person's credential (an API key, or the host's
	// session: Options.Console). Mount it at ConsolePath on the origin that serves Handler.
	ConsoleHandler http.Handler

	opts    Options
	reg     *modules.Registry
	rt      *modules.Runtime
	env     *envelope.Envelope
	nodes   *nodes.Module
	gateway *gateway.Gateway
	metrics *metrics.Metrics

	ready atomic.Bool

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// New validates opts, registers the core and the modules and checks what they registered. It
// starts nothing and touches neither the database nor the network.
func New(opts Options) (*Compute, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	promReg := prometheus.NewRegistry()
	m := metrics.New(promReg)
	nm := nodes.New(nodes.Config{GatewayAddresses: o.GatewayAddresses, CertLifetime: o.NodeCertLifetime})
	gw := gateway.New(nm, gateway.Config{HeartbeatInterval: o.HeartbeatInterval, Metrics: m})
	var cache *iam.DecisionCache
	if o.DecisionCacheTTL > 0 {
		cache = iam.NewDecisionCache(o.DecisionCacheTTL, DefaultDecisionCacheMax)
	}
	ev := &events.Module{}
	wh, err := webhooks.New(webhooks.Config{Wake: ev.Sequenced, Outbound: o.outbound, Timeout: o.Webhooks.Timeout,
		MaxResponseBytes: o.Webhooks.MaxResponseBytes, RetryBase: o.Webhooks.RetryBase, RetryMax: o.Webhooks.RetryMax,
		DeadAfter: o.Webhooks.DeadAfter, MaxEndpoints: o.Webhooks.MaxEndpointsPerTenant, Metrics: m})
	if err != nil {
		return nil, &OptionError{Field: "Webhooks", Problem: err.Error()}
	}
	if t := cmp.Or(o.Webhooks.Timeout, webhooks.DefaultTimeout) + webhooks.Bookkeeping; t >= o.JobRescueAfter {
		return nil, &OptionError{Field: "JobRescueAfter", Problem: fmt.Sprintf("(%s) must exceed a webhook attempt's timeout and its bookkeeping (%s)", o.JobRescueAfter, t)}
	}
	jm := &jobsModule{}
	leases := capacity.NewLeases(capacity.LeaseConfig{TTL: o.PoolLeaseTTL, Logger: o.Logger})
	reg, err := registry(ev, capacity.Module{Leases: leases}, append([]Module{nm, jointokens.Module{}, wh, gatewayModule{gw}, iamEvents{cache}, jm}, o.Modules...))
	if err != nil {
		return nil, err
	}
	c := &Compute{opts: o, reg: reg, nodes: nm, gateway: gw, metrics: m}
	c.rt = newRuntime(o, reg, nm, leases)
	if jm.client, err = newJobs(o, reg, c.rt); err != nil {
		return nil, err
	}
	c.rt.Jobs = jm.client
	if c.env, err = envelope.New(envelope.Config{Registry: reg, Runtime: c.rt, Cache: cache, MaxBodyBytes: o.MaxBodyBytes, Metrics: m}); err != nil {
		return nil, fmt.Errorf("compute: %w", err)
	}
	c.MetricsHandler = c.registerMetrics(promReg)
	if c.ConsoleHandler, err = console.New(o.Console); err != nil {
		var oe *console.OptionError
		if errors.As(err, &oe) {
			return nil, &OptionError{Field: "Console." + oe.Field, Problem: oe.Problem}
		}
		return nil, fmt.Errorf("compute: console: %w", err)
	}
	a := newAPI(c)
	c.API = &a
	upload := releases.UploadHandler(c.rt)
	eventStream := &stream.Handler{List: c.API.Events.List, MaxPerKey: o.MaxEventStreamsPerKey}
	tunnels := access.TunnelHandler(o.Database, gw, o.Logger)
	c.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.ready.Load() {
			envelope.Unavailable("the API (Initialize has not completed)").ServeHTTP(w, r)
			return
		}
		if stream.Is(r) {
			eventStream.ServeHTTP(w, r)
			return
		}
		if access.IsTunnel(r) {
			tunnels.ServeHTTP(w, r)
			return
		}
		if isReleaseUpload(r) {
			upload.ServeHTTP(w, r)
			return
		}
		c.env.ServeHTTP(w, r)
	})
	// Beside the sessions, the release repository, for nodes to update bcd through their own
	// mutual TLS (docs/releases.md).
	nodeMux := http.NewServeMux()
	nodeMux.Handle(tufrepo.NodePath, gw.NodeFiles(releases.NodeFiles(o.Database)))
	nodeMux.Handle("/", gw.Handler())
	c.NodeHandler = nodeMux
	// Anyone may call JoinService: its requests are bounded before they are read.
	_, join := agentv1connect.NewJoinServiceHandler(joinService{nm}, connect.WithReadMaxBytes(nodes.MaxJoinBytes))
	c.JoinHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.ready.Load() {
			envelope.Unavailable("JoinService (Initialize has not completed)").ServeHTTP(w, r)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, nodes.MaxJoinBytes+1024) // framing on top of the message
		join.ServeHTTP(w, r)
	})
	return c, nil
}

// registerMetrics registers, beside the series the envelope and the gateway record, those read
// at scrape time, and returns the handler that serves them all.
func (c *Compute) registerMetrics(reg *prometheus.Registry) http.Handler {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.metrics.Gateway(c.gateway.Sessions, c.gateway.HeartbeatInterval)
	c.metrics.DBPool(c.opts.Database.Pool)
	db := c.opts.Database.Pool
	c.metrics.Fleet(metrics.Fleet{
		GPUs:         func(ctx context.Context) ([]metrics.PoolGPUs, error) { return capacity.GPUStats(ctx, db) },
		Reservations: func(ctx context.Context) ([]metrics.Reservations, error) { return capacity.ReservationStats(ctx, db) },
	}, c.opts.Logger)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(c.opts.Logger.Handler(), slog.LevelWarn)})
}

// ConsolePath is where ConsoleHandler expects to be mounted.
const ConsolePath = console.Path

// JoinPath is where JoinHandler expects to be mounted.
const JoinPath = agentv1connect.JoinServiceName + "/"

// GatewayServices registers the node protocol's session service on a host's grpc.Server, as an
// alternative to NodeHandler. The server's credentials must come from GatewayTLS.
func (c *Compute) GatewayServices(s grpc.ServiceRegistrar) { c.gateway.Register(s) }

// GatewayTLS returns the TLS configuration of a gateway listener: a server certificate from the
// machine CA for hosts (names or IP addresses nodes dial), TLS 1.3, client certificates required
// and checked against revocation (from memory) when a session opens; handshakes beyond the
// gateway's admission rate refused before their cryptography; the server certificate is
// reissued once two thirds of its life have passed. Initialize must have completed.
func (c *Compute) GatewayTLS(ctx context.Context, hosts ...string) (*tls.Config, error) {
	auth, err := c.nodes.Authority()
	if err != nil {
		return nil, fmt.Errorf("compute: GatewayTLS before Initialize: %w", err)
	}
	if len(hosts) == 0 {
		return nil, errors.New("compute: GatewayTLS needs the hosts nodes dial")
	}
	cert, err := auth.IssueGateway(ctx, c.gateway.ID(), hosts)
	if err != nil {
		return nil, err
	}
	cfg := auth.ServerTLS(cert)
	cfg.GetConfigForClient = c.gateway.AdmitHandshake
	return cfg, nil
}

// joinService adapts the nodes module to Connect.
type joinService struct{ m *nodes.Module }

func (j joinService) Join(ctx context.Context, req *connect.Request[agentv1.JoinRequest]) (*connect.Response[agentv1.JoinResponse], error) {
	resp, err := j.m.Join(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// gatewayModule runs the gateway in the gateway process mode.
type gatewayModule struct{ gw *gateway.Gateway }

func (gatewayModule) Name() string { return "gateway" }

func (m gatewayModule) Register(r *modules.Registry) error {
	r.Worker(modules.Worker{Name: "gateway", Modes: []string{string(ModeGateway)}, Run: m.gw.Run})
	r.EventTypes(modules.EventType{Name: "gpu.health", Description: "A node reported a GPU's health change (an XID, say)."})
	return nil
}

// registry registers the core (with ev, the event log, and capm, capacity), then mods, and
// checks the whole.
func registry(ev *events.Module, capm capacity.Module, mods []Module) (*modules.Registry, error) {
	reg := modules.NewRegistry()
	for _, m := range append([]Module{coreModule{}, fleet.Module{}, ev, audit.Module{}, capm, workflow.Module{}, access.Module{}, fleetconfig.Module{}, quorum.Module{}, releases.Module{}, rollouts.Module{}}, mods...) {
		if err := reg.Add(m); err != nil {
			return nil, fmt.Errorf("compute: %w", err)
		}
	}
	if err := reg.Check(); err != nil {
		return nil, fmt.Errorf("compute: %w", err)
	}
	return reg, nil
}

// MigrationSets returns every migration set the core and mods own, in the order Initialize
// applies them. Test helpers use it to build template databases.
func MigrationSets(mods ...Module) ([]postgres.MigrationSet, error) {
	wh, err := webhooks.New(webhooks.Config{})
	if err != nil {
		return nil, err
	}
	reg, err := registry(&events.Module{}, capacity.Module{}, append([]Module{nodes.New(nodes.Config{}), jointokens.Module{}, wh}, mods...))
	if err != nil {
		return nil, err
	}
	return append([]postgres.MigrationSet{postgres.Core}, reg.MigrationSets()...), nil
}

// Handlers returns every method a control plane with mods serves, with its types, in the order
// GET /api/compute/methods lists them: what the API's surface is made of (api/surface.json,
// docs/compatibility.md). It touches neither the database nor the network.
func Handlers(mods ...Module) ([]*modules.Handler, error) {
	wh, err := webhooks.New(webhooks.Config{})
	if err != nil {
		return nil, err
	}
	gw := gateway.New(nodes.New(nodes.Config{}), gateway.Config{})
	reg, err := registry(&events.Module{}, capacity.Module{}, append([]Module{nodes.New(nodes.Config{}), jointokens.Module{}, wh, gatewayModule{gw}, iamEvents{}, &jobsModule{}}, mods...))
	if err != nil {
		return nil, err
	}
	return reg.Handlers(), nil
}

// Initialize applies migrations (under an advisory lock, so several processes may start at
// once), prepares the IAM port, contributes the catalog to IAM and runs the modules' start hooks.
// It may be called again; what is done is not redone.
func (c *Compute) Initialize(ctx context.Context) error {
	sets := append([]postgres.MigrationSet{postgres.Core}, c.reg.MigrationSets()...)
	if err := postgres.Migrate(ctx, c.opts.Database, sets...); err != nil {
		return fmt.Errorf("compute: initialize: %w", err)
	}
	if s, ok := c.opts.IAM.(iam.ResolverSetter); ok {
		s.SetResolver(resolver{c.opts.Database, c.reg})
	}
	if i, ok := c.opts.IAM.(iam.Initializer); ok {
		if err := i.Initialize(ctx); err != nil {
			return fmt.Errorf("compute: initialize IAM: %w", err)
		}
	}
	if ok, err := iam.TenantWithin(ctx, c.opts.IAM, c.opts.RootTenantID, c.opts.RootTenantID); err != nil {
		return fmt.Errorf("compute: initialize: read the root tenant: %w", err)
	} else if !ok {
		return fmt.Errorf("compute: initialize: IAM has no tenant %q (Options.RootTenantID)", c.opts.RootTenantID)
	}
	if err := c.opts.IAM.RegisterCatalog(ctx, c.reg.Catalog()); err != nil {
		return fmt.Errorf("compute: initialize: register the IAM catalog: %w", err)
	}
	if err := c.reg.RunInitialize(ctx, c.rt); err != nil {
		return fmt.Errorf("compute: initialize: %w", err)
	}
	c.ready.Store(true)
	return nil
}

// Start runs the background work of the process mode (Options.Mode) until Stop is called or ctx
// ends. Initialize must have succeeded.
func (c *Compute) Start(ctx context.Context) error {
	if !c.ready.Load() {
		return errors.New("compute: Start before Initialize")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("compute: already started")
	}
	c.started = true
	ctx, c.cancel = context.WithCancel(ctx)
	for _, w := range c.reg.Workers() {
		if !w.RunsIn(string(c.opts.Mode)) {
			continue
		}
		c.done.Add(1)
		go func() {
			defer c.done.Done()
			c.supervise(ctx, w)
		}()
	}
	return nil
}

// supervise runs a worker until ctx ends, restarting it with backoff when it fails.
func (c *Compute) supervise(ctx context.Context, w modules.Worker) {
	backoff := time.Second
	for ctx.Err() == nil {
		err := w.Run(modules.ObserveTicks(ctx, w.Name, c.metrics.Tick), c.rt)
		if ctx.Err() != nil {
			return
		}
		c.opts.Logger.Error("compute: worker failed; restarting", "worker", w.Name, "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// Stop ends the background work and waits for it, at most until ctx is done.
func (c *Compute) Stop(ctx context.Context) error {
	c.mu.Lock()
	cancel := c.cancel
	c.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	finished := make(chan struct{})
	go func() { c.done.Wait(); close(finished) }()
	select {
	case <-finished:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("compute: stop: background work did not finish: %w", ctx.Err())
	}
}

// Runtime is what modules get of the core: the services of modules.Runtime. A host may use them
// too, e.g. the secret box for its own secrets.
func (c *Compute) Runtime() *modules.Runtime { return c.rt }

// Mode is the process mode.
func (c *Compute) Mode() Mode { return c.opts.Mode }

// Methods returns every method this control plane serves, core and modules'.
func (c *Compute) Methods() []api.MethodInfo { return c.env.Methods() }

// Invoke calls method m in-process, through the same envelope as HTTP. Modules use it to offer
// typed calls for their own methods.
func Invoke[In, Out any](ctx context.Context, c *Compute, credential string, m api.Method[In, Out], in In) (Out, error) {
	var out Out
	h, err := c.handler(m.Info())
	if err != nil {
		return out, err
	}
	res, err := c.env.Invoke(ctx, credential, h, in)
	if err != nil {
		return out, err
	}
	return answer[Out](m.Info(), res)
}

// InvokeTx calls method m in-process inside the host's transaction tx: what the call writes
// commits or rolls back with the host's own rows. Authentication, validation and the one IAM
// decision are Invoke's; the method runs in a savepoint of tx (retried there when the database
// reports a deadlock), never in a batch. tx must be READ COMMITTED, and the IAM decision is made
// while it is open (see docs/modules.md, "In the host's transaction").
func InvokeTx[In, Out any](ctx context.Context, c *Compute, tx pgx.Tx, credential string, m api.Method[In, Out], in In) (Out, error) {
	var out Out
	h, err := c.handler(m.Info())
	if err != nil {
		return out, err
	}
	res, err := c.env.InvokeTx(ctx, tx, credential, h, in)
	if err != nil {
		return out, err
	}
	return answer[Out](m.Info(), res)
}

// handler finds the registered implementation of m, once Initialize has completed.
func (c *Compute) handler(m api.MethodInfo) (*modules.Handler, error) {
	if !c.ready.Load() {
		return nil, api.Errorf(api.CodeUnavailable, "compute: Initialize has not completed")
	}
	h, ok := c.reg.Lookup(m.Group, m.Name)
	if !ok {
		return nil, api.Errorf(api.CodeNotFound, "method %s is not registered (is its module in Options.Modules?)", m.FullName())
	}
	return h, nil
}

// answer is a call's typed result: its value, or the stored answer an idempotency key replayed.
func answer[Out any](m api.MethodInfo, res envelope.Result) (Out, error) {
	var out Out
	if res.Replay != nil {
		if err := decodeReplay(res.Replay, &out); err != nil {
			return out, api.Errorf(api.CodeInternal, "decode the stored answer of %s: %v", m.FullName(), err)
		}
		return out, nil
	}
	return res.Value.(Out), nil
}

// HeartbeatInterval is the interval this process's gateway asks of its nodes now.
func (c *Compute) HeartbeatInterval() time.Duration { return c.gateway.HeartbeatInterval() }
