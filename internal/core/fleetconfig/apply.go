package fleetconfig

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/webhooks"
	"github.com/better-compute/compute/modules"
)

// ReasonStalePlan is the reason of the failed_precondition an apply answers when the live state
// no longer has the plan's fingerprint.
const ReasonStalePlan = "stale_plan"

// apply applies a document in the call's one transaction, after the call's one IAM decision:
// it locks the rows of the kinds the document manages, refuses a plan whose fingerprint is no
// longer the live state's, makes the changes through the methods that own the rows, and records
// the document, who applied it and the state it left. Any failure rolls all of it back.
func apply(ctx context.Context, c *modules.Call, in api.ApplyFleet) (api.AppliedFleet, error) {
	tenant := c.Target.TenantID
	doc, err := load(in.Document, tenant)
	if err != nil {
		return api.AppliedFleet{}, err
	}
	// One apply of a tenant at a time: the second waits, then finds the state changed.
	if _, err := c.Tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('compute.fleet_configs:' || $1, 0))`, tenant); err != nil {
		return api.AppliedFleet{}, err
	}
	st, err := readState(ctx, c.Tx, tenant, doc.Spec.Manages)
	if err != nil {
		return api.AppliedFleet{}, err
	}
	if live := st.fingerprint(doc.Spec.Manages); live != in.Fingerprint {
		return api.AppliedFleet{}, &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("the plan is stale: the live state of tenant %s has changed since it was planned (fingerprint %s, now %s); plan again and review the changes", tenant, in.Fingerprint, live),
			Details: map[string]any{"reason": ReasonStalePlan, "planned": in.Fingerprint, "live": live}}
	}
	p, err := diff(doc, st, in.Prune, true)
	if err != nil {
		return api.AppliedFleet{}, err
	}
	x := &executor{c: c, tenant: tenant, poolIDs: map[string]string{}, secrets: map[string]string{}}
	for _, o := range st.spec.Pools {
		x.poolIDs[o.Name] = st.ids["pool/"+o.Name]
	}
	for _, s := range p.steps {
		if err := x.step(ctx, s); err != nil {
			return api.AppliedFleet{}, stepError(s.change, err)
		}
	}
	after, err := readState(ctx, c.Tx, tenant, nil)
	if err != nil {
		return api.AppliedFleet{}, err
	}
	out := api.AppliedFleet{TenantID: tenant, Fingerprint: after.fingerprint(doc.Spec.Manages), Changes: p.changes(), AppliedBy: c.Principal.ID}
	out.Summary = summarize(out.Changes)
	if len(x.secrets) > 0 {
		out.Secrets = x.secrets
	}
	err = c.Tx.QueryRow(ctx, `INSERT INTO compute.fleet_configs (tenant_id, document, prune, fingerprint, applied_by, applied_at)
		VALUES ($1, $2, $3, $4, $5, compute.compute_now())
		ON CONFLICT (tenant_id) DO UPDATE SET document = excluded.document, prune = excluded.prune, fingerprint = excluded.fingerprint,
			applied_by = excluded.applied_by, applied_at = excluded.applied_at, drift = '[]', drift_hash = '', drift_checked_at = NULL
		RETURNING applied_at`, tenant, doc, in.Prune, out.Fingerprint, out.AppliedBy).Scan(&out.AppliedAt)
	if err != nil {
		return api.AppliedFleet{}, err
	}
	out.AppliedAt = out.AppliedAt.UTC()
	err = c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventApplied, TenantID: tenant, Subject: tenant, Data: map[string]any{
		"appliedBy": out.AppliedBy, "fingerprint": out.Fingerprint, "prune": in.Prune,
		"create": out.Summary.Create, "update": out.Summary.Update, "delete": out.Summary.Delete}})
	return out, err
}

// executor makes a plan's changes in the call's transaction, through the registered methods'
// implementations, under the call's principal and its one decision.
type executor struct {
	c       *modules.Call
	tenant  string
	poolIDs map[string]string // by name, the pools created so far included
	secrets map[string]string // new endpoints' signing secrets, by URL
}

func (x *executor) target(id, kind, ref string) modules.Target {
	t := modules.Target{TenantID: x.tenant, ResourceID: "*", TenantPath: x.c.Target.TenantPath}
	if id != "" {
		t.ResourceID, t.Existing, t.Kind, t.Ref = id, true, kind, ref
	}
	return t
}

func (x *executor) step(ctx context.Context, s step) error {
	a, T := s.change.Action, x.tenant
	switch o := s.object.(type) {
	case api.FleetSite:
		switch a {
		case api.FleetCreate:
			_, err := run(ctx, x.c, api.SitesCreate, x.target("", "", ""), api.CreateSite{TenantID: T, Name: o.Name, DisplayName: o.DisplayName, Labels: o.Labels})
			return err
		case api.FleetUpdate:
			labels := nonNil(o.Labels)
			_, err := run(ctx, x.c, api.SitesUpdate, x.target(s.id, "site", o.Name), api.UpdateSite{TenantID: T, Site: o.Name, DisplayName: &o.DisplayName, Labels: &labels})
			return err
		default:
			_, err := run(ctx, x.c, api.SitesDelete, x.target(s.id, "site", o.Name), api.DeleteSite{TenantID: T, Site: o.Name})
			return err
		}
	case api.FleetPool:
		switch a {
		case api.FleetCreate:
			p, err := run(ctx, x.c, api.PoolsCreate, x.target("", "", ""), api.CreatePool{TenantID: T, Name: o.Name, Site: o.Site,
				DisplayName: o.DisplayName, Description: o.Description, Labels: o.Labels, Attestation: o.Attestation})
			x.poolIDs[o.Name] = p.ID
			return err
		case api.FleetUpdate:
			labels := nonNil(o.Labels)
			att := api.PoolAttestation{TPM: api.TPMOff}
			if o.Attestation != nil {
				att = *o.Attestation
			}
			_, err := run(ctx, x.c, api.PoolsUpdate, x.target(s.id, "pool", o.Name), api.UpdatePool{TenantID: T, Pool: o.Name,
				DisplayName: &o.DisplayName, Description: &o.Description, Labels: &labels, Attestation: &att})
			return err
		default:
			_, err := run(ctx, x.c, api.PoolsDelete, x.target(s.id, "pool", o.Name), api.DeletePool{TenantID: T, Pool: o.Name})
			return err
		}
	case api.FleetQuota:
		// Decided, as quotas.set is, in the pool's tenant: the document's.
		t := x.target(x.poolIDs[o.Pool], "pool", o.Pool)
		if a == api.FleetDelete {
			_, err := run(ctx, x.c, api.QuotasDelete, t, api.DeleteQuota{TenantID: o.Tenant, Pool: o.Pool, Resource: o.Resource, Model: o.Model})
			return err
		}
		_, err := run(ctx, x.c, api.QuotasSet, t, api.SetQuota{TenantID: o.Tenant, Pool: o.Pool, Resource: o.Resource, Model: o.Model, Limit: o.Limit})
		return err
	case api.FleetWebhook:
		switch a {
		case api.FleetCreate:
			w, err := run(ctx, x.c, api.WebhooksCreate, x.target("", "", ""), api.CreateWebhook{TenantID: T, URL: o.URL, EventTypes: o.EventTypes, Description: o.Description})
			if err == nil {
				x.secrets[o.URL] = w.Secret
			}
			return err
		case api.FleetUpdate:
			// webhooks has no update method; the endpoint keeps its secret and deliveries.
			_, err := webhooks.UpdateEndpoint(ctx, x.c.Tx, T, s.id, o.Description, o.EventTypes)
			return err
		default:
			_, err := run(ctx, x.c, api.WebhooksDelete, x.target(s.id, "webhook", o.URL), api.WebhookRef{TenantID: T, Webhook: s.id})
			return err
		}
	}
	return fmt.Errorf("fleetconfig: no way to %s a %T", a, s.object)
}

// run runs method m's registered implementation in the call's transaction, as the envelope
// would after a decision (the input checked and validated first), with target t: the apply's
// one decision covers it.
func run[In, Out any](ctx context.Context, c *modules.Call, m api.Method[In, Out], t modules.Target, in In) (Out, error) {
	var out Out
	h, ok := c.Runtime.Registry.Lookup(m.Group, m.Name)
	if !ok {
		return out, fmt.Errorf("fleetconfig: method %s is not registered", m.FullName())
	}
	if err := api.CheckInput(in); err != nil {
		return out, err
	}
	if v, ok := any(in).(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return out, err
		}
	}
	res, err := h.Run(ctx, &modules.Call{Principal: c.Principal, Target: t, Tx: c.Tx, Runtime: c.Runtime}, in)
	if err != nil {
		return out, err
	}
	return res.(Out), nil
}

// stepError says which change failed: an API error keeps its code, with the change in its
// details and, for a field of a listed object, the field's path in the document.
func stepError(c api.FleetChange, err error) error {
	where := c.Action + " " + c.Kind + " " + c.Key
	if c.Path != "" {
		where += " (" + c.Path + ")"
	}
	var e *api.Error
	if !errors.As(err, &e) || errors.Is(err, modules.ErrRetry) {
		return fmt.Errorf("fleet.apply: %s: %w", where, err)
	}
	out := e.With("change", map[string]any{"action": c.Action, "kind": c.Kind, "key": c.Key})
	out.Message = "fleet.apply: " + where + ": " + e.Message
	if f, ok := e.Details["field"].(string); ok && c.Path != "" {
		out.Details["field"] = c.Path + "." + f
	}
	return out
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
