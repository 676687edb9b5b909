// Package nodes is the control plane's side of nodes at work: join tokens and the JoinService,
// node lifecycle (cordon, drain, retire, labels), commands, desired state, and the sessions table,
// whose writes the gateway calls. It owns the machine PKI's use: the CA is loaded at Initialize.
package nodes

import (
	"context"
	"embed"
	"errors"
	"sync/atomic"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the schema of nodes at work. It builds on fleet's and capacity's.
var Migrations = postgres.EmbeddedMigrations("nodes", "compute", migrationsFS)

// Config configures the nodes module. Zero values mean the defaults.
type Config struct {
	// GatewayAddresses are handed to joining nodes (host:port).
	GatewayAddresses []string
	// CertLifetime is how long a node certificate is valid; default pki.DefaultNodeLifetime.
	CertLifetime time.Duration
	// Tick is how often the worker fails commands past their deadline and marks silent nodes
	// offline; default 1s.
	Tick time.Duration
}

// MaxJoinBytes bounds a JoinService request, which anyone may send: a token, a CSR and a few
// facts fit in a few kilobytes.
const MaxJoinBytes = 64 << 10

// Module registers the node groups and owns the machine CA once loaded.
type Module struct {
	cfg       Config
	authority atomic.Pointer[pki.Authority]
	rt        atomic.Pointer[modules.Runtime]
	reg       *modules.Registry // for the join credentials modules register
}

// New returns the nodes module.
func New(cfg Config) *Module {
	if cfg.CertLifetime == 0 {
		cfg.CertLifetime = pki.DefaultNodeLifetime
	}
	if cfg.Tick == 0 {
		cfg.Tick = time.Second
	}
	return &Module{cfg: cfg}
}

// Name implements modules.Module.
func (*Module) Name() string { return "nodes" }

// Register implements modules.Module.
func (m *Module) Register(r *modules.Registry) error {
	r.Migrations(pki.Migrations, Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceCommand, Description: "One-shot work for a node."})
	r.Actions(modules.ActionsFor(api.NodeMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: "node.joined", Description: "A machine joined a pool (data: pool, name)."},
		modules.EventType{Name: "node.attested", Description: "A joining machine's TPM proved its EK and quoted PCRs 0-7 (data: pool, name, ekFingerprint, trust, pcrs)."},
		modules.EventType{Name: "node.online", Description: "A node's session began, or its heartbeats came back (data: gateway)."},
		modules.EventType{Name: "node.offline", Description: "A node fell silent past its grace period, or its session's stream ended (data: gateway, closed)."},
		modules.EventType{Name: "node.active", Description: "A node was uncordoned (data: from)."},
		modules.EventType{Name: "node.cordoned", Description: "A node takes no new bookings (data: from)."},
		modules.EventType{Name: "node.draining", Description: "A node's bookings are being ended (data: from)."},
		modules.EventType{Name: "node.retired", Description: "A node left the fleet for good (data: from)."},
		modules.EventType{Name: "node.report_refused", Description: "A node's result or inventory was refused: unsigned, not signed by the node's key, of another node or session, or replayed (data: reason, kind)."},
		modules.EventType{Name: "command.created", Description: "A command was queued for a node (data: node, kind)."},
		modules.EventType{Name: "command.finished", Description: "A command succeeded, failed (its result, or its deadline) or was cancelled (data: node, kind, state, error, and seconds from its creation for a result or a deadline)."},
	)
	r.OnInitialize(func(ctx context.Context, rt *modules.Runtime) error {
		a, err := pki.Load(ctx, rt.DB, rt.Secret)
		if err != nil {
			return err
		}
		m.authority.Store(a)
		m.rt.Store(rt)
		return nil
	})
	r.Worker(modules.Worker{Name: "nodes", Modes: []string{"worker"}, Run: m.runWorker})
	registerRemediation(r)
	m.reg = r
	registerLifecycle(r)
	registerBatches(r)
	registerCommands(r)
	return nil
}

// ErrNotInitialized is returned by the node surfaces before Initialize.
var ErrNotInitialized = errors.New("nodes: not initialized")

// Authority is the machine CA, once Initialize has loaded it.
func (m *Module) Authority() (*pki.Authority, error) {
	a := m.authority.Load()
	if a == nil {
		return nil, ErrNotInitialized
	}
	return a, nil
}

// Runtime is the module's runtime, once initialized.
func (m *Module) Runtime() (*modules.Runtime, error) {
	rt := m.rt.Load()
	if rt == nil {
		return nil, ErrNotInitialized
	}
	return rt, nil
}

// CertLifetime is how long node certificates are valid.
func (m *Module) CertLifetime() time.Duration { return m.cfg.CertLifetime }

func (m *Module) runWorker(ctx context.Context, rt *modules.Runtime) error {
	return modules.Every(ctx, m.cfg.Tick, func() error {
		if _, err := FailOverdueCommands(ctx, rt.DB.Pool); err != nil {
			return err
		}
		_, err := MarkOffline(ctx, rt.DB)
		return err
	})
}
