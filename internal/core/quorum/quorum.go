// Package quorum is the destructive-batch quorum (docs/fleet.md, "Destructive-batch quorum"): a
// tenant's policy of how large a destructive batch (draining, retiring, wiping or redeploying
// many nodes or machines at once) may be before principals other than its caller must approve
// it, the approvals such a batch waits for, and the gate each batch method passes (Service,
// modules.Runtime.Quorum). An approval is bound to one batch by a digest of its method, its
// sorted targets and its parameters, and runs that batch once.
package quorum

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the quorum's schema: policies, approvals and their votes.
var Migrations = postgres.EmbeddedMigrations("quorum", "compute", migrationsFS)

// The quorum's events. The subject of an approval's is the approval; of quorum.updated, the tenant.
const (
	EventRequested = "approval.requested"
	EventApproved  = "approval.approved"
	EventDenied    = "approval.denied"
	EventConsumed  = "approval.consumed"
	EventUpdated   = "quorum.updated"
)

// Module owns the quorum's tables and methods.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "quorum" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(
		iam.ResourceType{Name: api.ResourceQuorum, Description: "A tenant's destructive-batch quorum policy."},
		iam.ResourceType{Name: api.ResourceApproval, Description: "An approval a destructive batch over the quorum policy waits for."},
	)
	r.Actions(modules.ActionsFor(api.QuorumMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventRequested, Description: "A destructive batch over its tenant's quorum policy asked for approval (data: method, targets, reason, requestedBy, approvers, expiresAt)."},
		modules.EventType{Name: EventApproved, Description: "A principal approved a destructive batch (data: principal, votes, approvers, state: approved once enough have)."},
		modules.EventType{Name: EventDenied, Description: "A principal denied a destructive batch (data: principal, comment)."},
		modules.EventType{Name: EventConsumed, Description: "A destructive batch ran with its approval, which is spent (data: method, principal)."},
		modules.EventType{Name: EventUpdated, Description: "A tenant's quorum policy was set (data: maxNodes, maxPercent, approvers, ttl, principal)."},
	)
	modules.Handle(r, api.QuorumGet, nil, func(ctx context.Context, c *modules.Call, _ api.GetQuorum) (api.QuorumPolicy, error) {
		return Effective(ctx, c.Tx, c.Target.TenantID, c.Target.TenantPath)
	})
	modules.Handle(r, api.QuorumSet, nil, set)
	modules.Handle(r, api.ApprovalsList, nil, list)
	modules.Handle(r, api.ApprovalsGet, func(ctx context.Context, l modules.Lookup, in api.ApprovalRef) (modules.Target, error) {
		return approvalTarget(ctx, l, in.Approval)
	}, func(ctx context.Context, c *modules.Call, in api.ApprovalRef) (api.Approval, error) {
		return get(ctx, c.Tx, in.Approval, c.Target.TenantID)
	})
	decideTarget := func(ctx context.Context, l modules.Lookup, in api.DecideApproval) (modules.Target, error) {
		return approvalTarget(ctx, l, in.Approval)
	}
	modules.Handle(r, api.ApprovalsApprove, decideTarget, func(ctx context.Context, c *modules.Call, in api.DecideApproval) (api.Approval, error) {
		return vote(ctx, c, in, true)
	})
	modules.Handle(r, api.ApprovalsDeny, decideTarget, func(ctx context.Context, c *modules.Call, in api.DecideApproval) (api.Approval, error) {
		return vote(ctx, c, in, false)
	})
	return nil
}

// Effective is the policy that applies in tenant: its own, or the nearest ancestor's on path
// (tenant first, as IAM reports it); off when none has one.
func Effective(ctx context.Context, q postgres.Querier, tenant string, path []string) (api.QuorumPolicy, error) {
	if len(path) == 0 {
		path = []string{tenant}
	}
	p := api.QuorumPolicy{TenantID: tenant}
	var ttl time.Duration
	var at time.Time
	err := q.QueryRow(ctx, `SELECT tenant_id, max_nodes, max_percent, approvers, ttl, updated_by, updated_at
		FROM compute.quorum_policies WHERE tenant_id = ANY($1) ORDER BY array_position($1, tenant_id) LIMIT 1`, path).
		Scan(&p.From, &p.MaxNodes, &p.MaxPercent, &p.Approvers, &ttl, &p.UpdatedBy, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.QuorumPolicy{TenantID: tenant, Approvers: api.DefaultApprovers, TTL: api.DefaultApprovalTTL.String()}, nil
	}
	if err != nil {
		return p, err
	}
	p.TTL, p.UpdatedAt = ttl.String(), &at
	return p, nil
}

// set replaces the tenant's own policy.
func set(ctx context.Context, c *modules.Call, in api.SetQuorum) (api.QuorumPolicy, error) {
	ttl, err := in.ApprovalTTL()
	if err != nil {
		return api.QuorumPolicy{}, err
	}
	approvers := in.Approvers
	if approvers == 0 {
		approvers = api.DefaultApprovers
	}
	tenant := c.Target.TenantID
	if _, err := c.Tx.Exec(ctx, `INSERT INTO compute.quorum_policies (tenant_id, max_nodes, max_percent, approvers, ttl, updated_by, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, compute.compute_now())
		ON CONFLICT (tenant_id) DO UPDATE SET max_nodes = excluded.max_nodes, max_percent = excluded.max_percent,
			approvers = excluded.approvers, ttl = excluded.ttl, updated_by = excluded.updated_by, updated_at = excluded.updated_at`,
		tenant, in.MaxNodes, in.MaxPercent, approvers, ttl, c.Principal.ID); err != nil {
		return api.QuorumPolicy{}, err
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventUpdated, TenantID: tenant, Subject: tenant, Data: map[string]any{
		"maxNodes": in.MaxNodes, "maxPercent": in.MaxPercent, "approvers": approvers, "ttl": ttl.String(), "principal": c.Principal.ID,
	}}); err != nil {
		return api.QuorumPolicy{}, err
	}
	return Effective(ctx, c.Tx, tenant, []string{tenant})
}

// approvalTarget finds the tenant of an approval, before the decision.
func approvalTarget(ctx context.Context, l modules.Lookup, id string) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "approval", Ref: id, ResourceID: id}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.approvals WHERE id = $1`, id).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("approval", id)
	}
	return t, err
}

// stateSQL is an approval's state as callers see it: pending and approved ones read as expired
// once past their expiry.
const stateSQL = `CASE WHEN a.state IN ('pending', 'approved') AND a.expires_at <= compute.compute_now() THEN 'expired' ELSE a.state END`

const approvalColumns = `a.id::text, a.tenant_id, a.method, a.targets, a.params, encode(a.digest, 'hex'), a.reason, a.requested_by, ` + stateSQL + `,
	a.approvers, a.created_at, a.expires_at, a.consumed_at,
	coalesce((SELECT jsonb_agg(jsonb_build_object('principal', v.principal, 'approve', v.approve, 'comment', nullif(v.comment, ''), 'at', v.at) ORDER BY v.at, v.principal)
		FROM compute.approval_votes v WHERE v.approval_id = a.id), '[]'::jsonb)`

func scanApproval(row pgx.Row) (api.Approval, error) {
	var a api.Approval
	err := row.Scan(&a.ID, &a.TenantID, &a.Method, &a.Targets, &a.Params, &a.Digest, &a.Reason, &a.RequestedBy, &a.State,
		&a.Approvers, &a.CreatedAt, &a.ExpiresAt, &a.ConsumedAt, &a.Votes)
	return a, err
}

// get reads an approval of tenant.
func get(ctx context.Context, q postgres.Querier, id, tenant string) (api.Approval, error) {
	a, err := scanApproval(q.QueryRow(ctx, `SELECT `+approvalColumns+` FROM compute.approvals a WHERE a.id = $1 AND a.tenant_id = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, api.NotFound("approval", id)
	}
	return a, err
}

const cursorKind = "ap1"

func list(ctx context.Context, c *modules.Call, in api.ListApprovals) (api.Page[api.Approval], error) {
	var after *string
	if in.Cursor != "" {
		key, err := api.DecodeIDCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.Approval]{}, err
		}
		after = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+approvalColumns+` FROM compute.approvals a
		WHERE a.tenant_id = $1 AND ($2 = '' OR `+stateSQL+` = $2) AND ($3::uuid IS NULL OR a.id < $3::uuid)
		ORDER BY a.id DESC LIMIT $4`, c.Target.TenantID, in.State, after, limit+1)
	if err != nil {
		return api.Page[api.Approval]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Approval, error) { return scanApproval(r) })
	if err != nil {
		return api.Page[api.Approval]{}, err
	}
	return api.PageOf(items, limit, cursorKind, func(a api.Approval) string { return a.ID }), nil
}

// vote records c's principal's answer to an approval: approving it (enough approvals make it
// approved) or denying it (it is then denied). The principal who asked may deny (withdraw) it,
// never approve it.
func vote(ctx context.Context, c *modules.Call, in api.DecideApproval, approve bool) (api.Approval, error) {
	tenant := c.Target.TenantID
	if _, err := c.Tx.Exec(ctx, `SELECT 1 FROM compute.approvals WHERE id = $1 FOR UPDATE`, in.Approval); err != nil {
		return api.Approval{}, err
	}
	a, err := get(ctx, c.Tx, in.Approval, tenant)
	if err != nil {
		return a, err
	}
	me := c.Principal.ID
	switch {
	case approve && a.RequestedBy == me:
		return a, api.Errorf(api.CodePermissionDenied, "approval %s was asked for by %s, who cannot approve their own batch: another principal must", a.ID, me).
			With("reason", "own_request")
	case a.State == api.ApprovalPending, !approve && a.State == api.ApprovalApproved:
	default:
		return a, api.Errorf(api.CodeFailedPrecondition, "approval %s is %s: only a pending approval can be %s", a.ID, a.State, map[bool]string{true: "approved", false: "denied"}[approve]).
			With("reason", "approval_"+a.State).With("state", a.State)
	}
	for _, v := range a.Votes {
		if v.Principal == me && approve {
			return a, api.Errorf(api.CodeConflict, "%s has already approved %s; it needs %d approvals from different principals", me, a.ID, a.Approvers).
				With("reason", "already_voted")
		}
	}
	if _, err := c.Tx.Exec(ctx, `INSERT INTO compute.approval_votes (approval_id, principal, approve, comment, at)
		VALUES ($1, $2, $3, $4, compute.compute_now())
		ON CONFLICT (approval_id, principal) DO UPDATE SET approve = excluded.approve, comment = excluded.comment, at = excluded.at`,
		a.ID, me, approve, in.Comment); err != nil {
		return a, err
	}
	data := map[string]any{"principal": me, "method": a.Method}
	typ := EventDenied
	if approve {
		typ = EventApproved
		var votes int
		if err := c.Tx.QueryRow(ctx, `UPDATE compute.approvals a SET state = CASE WHEN n >= a.approvers THEN 'approved' ELSE a.state END
			FROM (SELECT count(*) AS n FROM compute.approval_votes WHERE approval_id = $1 AND approve) v
			WHERE a.id = $1 RETURNING n`, a.ID).Scan(&votes); err != nil {
			return a, err
		}
		data["votes"], data["approvers"] = votes, a.Approvers
		data["state"] = map[bool]string{true: api.ApprovalApproved, false: api.ApprovalPending}[votes >= a.Approvers]
	} else {
		if _, err := c.Tx.Exec(ctx, `UPDATE compute.approvals SET state = 'denied' WHERE id = $1`, a.ID); err != nil {
			return a, err
		}
		if in.Comment != "" {
			data["comment"] = in.Comment
		}
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: typ, TenantID: tenant, Subject: a.ID, Data: data}); err != nil {
		return a, err
	}
	return get(ctx, c.Tx, a.ID, tenant)
}

// plural is n and noun, with an s when n is not 1.
func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
