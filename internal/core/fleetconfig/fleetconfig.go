// Package fleetconfig is fleet as code: a tenant's sites, pools, quotas and webhooks as one
// FleetConfig document that can be exported, planned against the live state (a diff, and the
// live state's fingerprint) and applied in one transaction after one IAM decision; the document
// last applied is kept, and a periodic River job reports drift from it. It writes only its own
// table (compute.fleet_configs): an apply makes its changes through the methods that own the
// rows (sites.create, quotas.set, …), run in its transaction without decisions of their own.
package fleetconfig

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the package's schema: the document last applied to each tenant.
var Migrations = postgres.EmbeddedMigrations("fleetconfig", "compute", migrationsFS)

// Queue is the River queue of the drift check.
const Queue = "fleet"

// DefaultDriftEvery is how often the drift of every applied FleetConfig is checked by default.
const DefaultDriftEvery = time.Minute

// The event types the package writes; their subject is the tenant.
const (
	EventApplied   = "fleet.applied"
	EventDrifted   = "fleet.drifted"
	EventConverged = "fleet.converged"
)

// Module registers the fleet group, its table and the drift check. It is part of the core.
type Module struct {
	// DriftEvery is how often drift is checked; 0 means DefaultDriftEvery.
	DriftEvery time.Duration
}

// Name implements modules.Module.
func (Module) Name() string { return "fleetconfig" }

// Register implements modules.Module.
func (m Module) Register(r *modules.Registry) error {
	every := m.DriftEvery
	if every == 0 {
		every = DefaultDriftEvery
	}
	if every < 0 {
		return fmt.Errorf("fleetconfig: DriftEvery must not be negative, got %s", every)
	}
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceFleet, Description: "A tenant's fleet as code (FleetConfig): applying it writes sites, pools, quotas and webhooks."})
	r.Actions(modules.ActionsFor(api.FleetConfigMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventApplied, Description: "A FleetConfig was applied to the tenant, its subject (data: appliedBy, fingerprint, prune, create, update, delete)."},
		modules.EventType{Name: EventDrifted, Description: "The live state of a tenant, the subject, drifted from its applied FleetConfig, or drifted otherwise than last told (data: count, changes: the first 50, appliedBy, appliedAt)."},
		modules.EventType{Name: EventConverged, Description: "The live state of a tenant, the subject, matches its applied FleetConfig again after a drift."},
	)
	r.JobQueue(modules.JobQueue{Name: Queue, MaxWorkers: 1,
		AddWorkers: func(w *river.Workers, rt *modules.Runtime) error {
			return river.AddWorkerSafely(w, &driftWorker{rt: rt})
		},
		Periodic: []modules.PeriodicJob{{Every: every, Args: func() river.JobArgs { return DriftArgs{} }}},
	})
	modules.Handle(r, api.FleetExport, nil, export)
	modules.Handle(r, api.FleetPlan, func(ctx context.Context, l modules.Lookup, in api.PlanFleet) (modules.Target, error) {
		return documentTarget(ctx, l, in.TenantID, in.Document)
	}, planFleet)
	modules.Handle(r, api.FleetApply, func(ctx context.Context, l modules.Lookup, in api.ApplyFleet) (modules.Target, error) {
		return documentTarget(ctx, l, in.TenantID, in.Document)
	}, apply)
	modules.Handle(r, api.FleetDrift, nil, drift)
	return nil
}

// documentTarget is the target of a plan or an apply: the tenant the input names, else the
// document's, else the caller's. It parses the document (outside any transaction) and checks
// that every quota limits that tenant or one of its descendants, which only IAM knows.
func documentTarget(ctx context.Context, l modules.Lookup, tenantID, document string) (modules.Target, error) {
	cfg, err := Parse(document)
	if err != nil {
		return modules.Target{}, err
	}
	tenant := tenantID
	switch {
	case tenant != "" && cfg.Metadata.Tenant != "" && tenant != cfg.Metadata.Tenant:
		return modules.Target{}, api.InvalidField("tenantId", "%q is not the document's tenant (metadata.tenant: %q): a document is applied to the tenant it describes", tenant, cfg.Metadata.Tenant)
	case tenant == "":
		tenant = cfg.Metadata.Tenant
	}
	if tenant == "" {
		tenant = l.Principal.TenantID
	}
	checked := map[string]bool{tenant: true}
	for i, q := range cfg.Spec.Quotas {
		if q.Tenant == "" || checked[q.Tenant] {
			continue
		}
		path, err := l.IAM.TenantPath(ctx, q.Tenant)
		if err != nil {
			return modules.Target{}, fmt.Errorf("fleetconfig: tenant path: %w", err)
		}
		if !slices.Contains(path, tenant) {
			return modules.Target{}, api.InvalidField(fmt.Sprintf("spec.quotas[%d].tenant", i), "%q is not tenant %s or one of its descendants: a quota of the document limits a tenant under the one it describes", q.Tenant, tenant)
		}
		checked[q.Tenant] = true
	}
	return modules.Target{TenantID: tenant, ResourceID: "*"}, nil
}

// load parses a document that documentTarget accepted and normalizes it for tenant.
func load(document, tenant string) (api.FleetConfig, error) {
	cfg, err := Parse(document)
	if err != nil {
		return cfg, err
	}
	doc := normalize(cfg, tenant)
	// A quota that names no tenant is the document's: only now can two be found to be one.
	seen := map[string]int{}
	for i, q := range doc.Spec.Quotas {
		k := q.Key(tenant)
		if j, ok := seen[k]; ok {
			return doc, api.InvalidField(fmt.Sprintf("spec.quotas[%d]", i), "is the same quota as spec.quotas[%d] (%s): each object appears once", j, k)
		}
		seen[k] = i
	}
	return doc, nil
}

func export(ctx context.Context, c *modules.Call, _ api.ExportFleet) (api.ExportedFleet, error) {
	st, err := readState(ctx, c.Tx, c.Target.TenantID, nil)
	if err != nil {
		return api.ExportedFleet{}, err
	}
	cfg := st.config()
	text, err := Render(cfg)
	if err != nil {
		return api.ExportedFleet{}, err
	}
	return api.ExportedFleet{TenantID: st.tenant, Fingerprint: st.fingerprint(api.FleetKinds), Document: text, Config: cfg}, nil
}

func planFleet(ctx context.Context, c *modules.Call, in api.PlanFleet) (api.FleetDiff, error) {
	tenant := c.Target.TenantID
	doc, err := load(in.Document, tenant)
	if err != nil {
		return api.FleetDiff{}, err
	}
	st, err := readState(ctx, c.Tx, tenant, nil)
	if err != nil {
		return api.FleetDiff{}, err
	}
	p, err := diff(doc, st, in.Prune, true)
	if err != nil {
		return api.FleetDiff{}, err
	}
	cs := p.changes()
	return api.FleetDiff{TenantID: tenant, Fingerprint: st.fingerprint(doc.Spec.Manages), Prune: in.Prune,
		Changes: cs, Kept: p.kept, Summary: summarize(cs)}, nil
}
