package iam

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// Delegation is a person's grant to an agent.
type Delegation struct {
	ID       string   `json:"id"`
	TenantID string   `json:"tenantId"`
	PersonID string   `json:"personId"`
	AgentID  string   `json:"agentId"`
	Confirm  []string `json:"confirm"` // action patterns the agent may do only with the person's confirmation
}

// CreateDelegation records that person delegates to agent in tenant, with confirm listing the
// actions (globs) that need the person's confirmation each time.
func (l *Local) CreateDelegation(ctx context.Context, tenantID, personID, agentID string, confirm []string) (Delegation, error) {
	if confirm == nil {
		confirm = []string{}
	}
	d := Delegation{ID: newID("dlg"), TenantID: tenantID, PersonID: personID, AgentID: agentID, Confirm: confirm}
	_, err := l.db.Pool.Exec(ctx, `INSERT INTO iam.delegations (id, tenant_id, person_id, agent_id, confirm) VALUES ($1, $2, $3, $4, $5)`,
		d.ID, tenantID, personID, agentID, confirm)
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		return Delegation{}, fmt.Errorf("iam: a delegation goes from a user (%s) to an agent (%s) of an existing tenant: %w", personID, agentID, ErrNotFound)
	}
	return d, err
}

// confirmFor returns the delegation that reserves action for confirmation, if any.
func (l *Local) confirmFor(ctx context.Context, agent, action string) (string, bool, error) {
	rows, err := l.db.Pool.Query(ctx, `SELECT id, confirm FROM iam.delegations WHERE agent_id = $1 AND revoked_at IS NULL ORDER BY id`, agent)
	if err != nil {
		return "", false, err
	}
	var id string
	var patterns []string
	var found string
	_, err = pgx.ForEachRow(rows, []any{&id, &patterns}, func() error {
		if found == "" && anyMatch(patterns, action) {
			found = id
		}
		return nil
	})
	return found, found != "", err
}

// consume uses up one approved confirmation of r by agent, if there is one.
func (l *Local) consume(ctx context.Context, agent string, r Request) (bool, error) {
	tag, err := l.db.Pool.Exec(ctx, `UPDATE iam.confirmations SET state = 'consumed', consumed_at = compute.compute_now()
		WHERE id = (SELECT id FROM iam.confirmations WHERE agent_id = $1 AND tenant_id = $2 AND action = $3 AND resource = $4
		            AND state = 'approved' ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)`,
		agent, r.TenantID, r.Action, r.Resource.String())
	return tag.RowsAffected() == 1, err
}

// RequestConfirmation implements Confirmer.
func (l *Local) RequestConfirmation(ctx context.Context, p Principal, r Request) (Confirmation, error) {
	delegation, ok, err := l.confirmFor(ctx, p.ID, r.Action)
	if err != nil {
		return Confirmation{}, err
	}
	if !ok {
		return Confirmation{}, fmt.Errorf("iam: %s needs no confirmation for %s", p.ID, r.Action)
	}
	var c Confirmation
	err = l.db.Tx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id FROM iam.confirmations WHERE agent_id = $1 AND tenant_id = $2 AND action = $3 AND resource = $4
			AND state = 'pending' ORDER BY requested_at LIMIT 1`, p.ID, r.TenantID, r.Action, r.Resource.String()).Scan(&c.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			c.ID = newID("cfm")
			_, err = tx.Exec(ctx, `INSERT INTO iam.confirmations (id, delegation_id, agent_id, tenant_id, action, resource) VALUES ($1, $2, $3, $4, $5, $6)`,
				c.ID, delegation, p.ID, r.TenantID, r.Action, r.Resource.String())
		}
		return err
	})
	if err != nil {
		return Confirmation{}, fmt.Errorf("iam: request a confirmation: %w", err)
	}
	return l.Confirmation(ctx, c.ID)
}

// Confirmation implements Confirmer.
func (l *Local) Confirmation(ctx context.Context, id string) (Confirmation, error) {
	var c Confirmation
	var res string
	err := l.db.Pool.QueryRow(ctx, `SELECT id, agent_id, tenant_id, action, resource, state, coalesce(decided_by, ''), decided_at
		FROM iam.confirmations WHERE id = $1`, id).Scan(&c.ID, &c.AgentID, &c.Request.TenantID, &c.Request.Action, &res, &c.State, &c.DecidedBy, &c.DecidedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("iam: confirmation %q: %w", id, ErrNotFound)
	}
	c.Request.Resource = parseResource(res)
	return c, err
}

func parseResource(s string) Resource {
	for i := range len(s) {
		if s[i] == '/' {
			return Resource{Type: s[:i], ID: s[i+1:]}
		}
	}
	return Resource{ID: s}
}

// DecideConfirmation is the person's answer: only the person of the confirmation's delegation
// may give it, and only once.
func (l *Local) DecideConfirmation(ctx context.Context, id, personID string, approve bool) error {
	state := "denied"
	if approve {
		state = "approved"
	}
	tag, err := l.db.Pool.Exec(ctx, `UPDATE iam.confirmations c SET state = $3, decided_at = compute.compute_now(), decided_by = $2
		FROM iam.delegations d WHERE c.id = $1 AND d.id = c.delegation_id AND d.person_id = $2 AND c.state = 'pending'`, id, personID, state)
	if err != nil {
		return fmt.Errorf("iam: decide confirmation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("iam: confirmation %q is not pending for person %s: %w", id, personID, ErrNotFound)
	}
	return nil
}
