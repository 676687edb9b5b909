package quorum

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

// Service is the gate batch methods pass (modules.Quorum).
type Service struct{}

var _ modules.Quorum = Service{}

// Check implements modules.Quorum.
func (Service) Check(ctx context.Context, c *modules.Call, b modules.Batch) (string, error) {
	pol, err := Effective(ctx, c.Tx, c.Target.TenantID, c.Target.TenantPath)
	if err != nil {
		return "", err
	}
	why := Over(pol, b)
	if why == "" {
		return "", nil // within the policy: an approval given is neither needed nor spent
	}
	digest, targets, err := Digest(b)
	if err != nil {
		return "", err
	}
	if b.Approval == "" {
		return "", open(ctx, c, b, pol, why, digest, targets)
	}
	return b.Approval, spend(ctx, c, b, digest)
}

// Over says why batch b is over policy p, "" when it is not.
func Over(p api.QuorumPolicy, b modules.Batch) string {
	n := len(b.Targets)
	if p.MaxNodes > 0 && n > p.MaxNodes {
		return fmt.Sprintf("%s at once (the policy allows %d)", plural(n, "target"), p.MaxNodes)
	}
	if p.MaxPercent > 0 {
		for _, g := range b.Groups {
			if g.Size > 0 && g.Count*100 > p.MaxPercent*g.Size {
				return fmt.Sprintf("%d of the %s of %s %s, more than %d%% (the policy allows %d%%)",
					g.Count, plural(g.Size, "member"), g.Kind, g.ID, g.Count*100/g.Size, p.MaxPercent)
			}
		}
	}
	return ""
}

// Digest is what an approval is bound to: SHA-256 of the method, the sorted targets and the
// canonical JSON of the params. It returns the sorted targets too.
func Digest(b modules.Batch) ([]byte, []string, error) {
	targets := slices.Clone(b.Targets)
	slices.Sort(targets)
	params, err := iam.CanonicalInput(paramsOf(b))
	if err != nil {
		return nil, nil, err
	}
	h := sha256.New()
	h.Write([]byte(b.Method))
	for _, t := range targets {
		h.Write([]byte{0})
		h.Write([]byte(t))
	}
	h.Write([]byte{0, 0})
	h.Write(params)
	return h.Sum(nil), targets, nil
}

func paramsOf(b modules.Batch) map[string]any {
	if b.Params == nil {
		return map[string]any{}
	}
	return b.Params
}

// open answers a batch over the policy that carries no approval: confirmation_required with the
// approval opened for it, or the open one of the same caller and batch. The approval is written
// in a transaction of its own: the call's rolls back with the refusal, and the approval must
// outlive it. (This is the one write outside the call's transaction, on a rare path.)
func open(ctx context.Context, c *modules.Call, b modules.Batch, pol api.QuorumPolicy, why string, digest []byte, targets []string) error {
	ttl, err := time.ParseDuration(pol.TTL)
	if err != nil {
		return fmt.Errorf("quorum: the policy's ttl %q: %w", pol.TTL, err)
	}
	var a api.Approval
	ctx = context.WithoutCancel(ctx) // the refusal's record is written even if the caller goes
	err = c.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error {
		// One open approval per caller and batch: asking again finds it.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "quorum/"+c.Principal.ID+"/"+hex.EncodeToString(digest)); err != nil {
			return err
		}
		var id string
		err := tx.QueryRow(ctx, `SELECT id::text FROM compute.approvals WHERE tenant_id = $1 AND requested_by = $2 AND digest = $3
			AND state IN ('pending', 'approved') AND expires_at > compute.compute_now() ORDER BY id DESC LIMIT 1`,
			c.Target.TenantID, c.Principal.ID, digest).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			id = uuid.Must(uuid.NewV7()).String()
			_, err = tx.Exec(ctx, `INSERT INTO compute.approvals (id, tenant_id, method, digest, targets, params, reason, requested_by, approvers, state, created_at, expires_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', compute.compute_now(), compute.compute_now() + $10::interval)`,
				id, c.Target.TenantID, b.Method, digest, targets, paramsOf(b), why, c.Principal.ID, pol.Approvers, ttl)
			if err != nil {
				return err
			}
			if a, err = get(ctx, tx, id, c.Target.TenantID); err != nil {
				return err
			}
			return c.Runtime.Events.Emit(ctx, tx, modules.Event{Type: EventRequested, TenantID: c.Target.TenantID, Subject: id, Data: map[string]any{
				"method": b.Method, "targets": targets, "reason": why, "requestedBy": c.Principal.ID, "approvers": pol.Approvers, "expiresAt": a.ExpiresAt,
			}})
		}
		if err != nil {
			return err
		}
		a, err = get(ctx, tx, id, c.Target.TenantID)
		return err
	})
	if err != nil {
		return err
	}
	if a.State == api.ApprovalApproved {
		return required(a, fmt.Sprintf("%s: approval %s of this batch is approved: make the same call again with \"approval\": %q before %s",
			b.Method, a.ID, a.ID, a.ExpiresAt.UTC().Format(time.RFC3339)))
	}
	return required(a, fmt.Sprintf("%s is a destructive batch over tenant %s's quorum policy (%s): it needs the approval of %s other than %s (approvals.approve %s) before %s; then make the same call again with \"approval\": %q",
		b.Method, c.Target.TenantID, why, plural(a.Approvers, "principal"), c.Principal.ID, a.ID, a.ExpiresAt.UTC().Format(time.RFC3339), a.ID))
}

// required is the confirmation_required answer naming approval a.
func required(a api.Approval, msg string) error {
	return &api.Error{Code: api.CodeConfirmationRequired, Message: msg, Details: map[string]any{
		"reason": "quorum", "approvalId": a.ID, "method": a.Method, "digest": a.Digest, "state": a.State,
		"approvers": a.Approvers, "why": a.Reason, "expiresAt": a.ExpiresAt, "tenantId": a.TenantID,
	}}
}

// spend checks the approval a call carries against its batch and, approved, spends it in the
// call's transaction: it runs its batch once. A batch that then fails rolls the spending back
// with it.
func spend(ctx context.Context, c *modules.Call, b modules.Batch, digest []byte) error {
	if uuid.Validate(b.Approval) != nil {
		return api.InvalidField("approval", "%q is not an approval's id", b.Approval)
	}
	if _, err := c.Tx.Exec(ctx, `SELECT 1 FROM compute.approvals WHERE id = $1 FOR UPDATE`, b.Approval); err != nil {
		return err
	}
	a, err := get(ctx, c.Tx, b.Approval, c.Target.TenantID)
	if err != nil {
		return err
	}
	want, err := hex.DecodeString(a.Digest)
	if err != nil {
		return err
	}
	switch {
	case a.RequestedBy != c.Principal.ID:
		return api.Errorf(api.CodePermissionDenied, "approval %s was asked for by %s: only they may run its batch", a.ID, a.RequestedBy).
			With("reason", "not_requester")
	case !bytes.Equal(want, digest):
		return api.Errorf(api.CodeFailedPrecondition, "approval %s is of another batch (%s on %s, digest %s): this call's batch needs its own approval (call without \"approval\" to ask for one)",
			a.ID, a.Method, plural(len(a.Targets), "target"), a.Digest).
			With("reason", "approval_mismatch").With("approvalId", a.ID)
	case a.State == api.ApprovalPending:
		return required(a, fmt.Sprintf("approval %s has %d of the %d approvals it needs (approvals.approve %s); make the same call again once it is approved, before %s",
			a.ID, approvals(a), a.Approvers, a.ID, a.ExpiresAt.UTC().Format(time.RFC3339)))
	case a.State != api.ApprovalApproved:
		return api.Errorf(api.CodeFailedPrecondition, "approval %s is %s: call without \"approval\" to ask for a new one", a.ID, a.State).
			With("reason", "approval_"+a.State).With("approvalId", a.ID).With("state", a.State)
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.approvals SET state = 'consumed', consumed_at = compute.compute_now() WHERE id = $1`, a.ID); err != nil {
		return err
	}
	return c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventConsumed, TenantID: a.TenantID, Subject: a.ID,
		Data: map[string]any{"method": a.Method, "principal": c.Principal.ID}})
}

func approvals(a api.Approval) int {
	n := 0
	for _, v := range a.Votes {
		if v.Approve {
			n++
		}
	}
	return n
}
