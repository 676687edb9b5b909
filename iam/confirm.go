package iam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// CanonicalInput is v as canonical JSON: object keys sorted, no insignificant space, numbers as
// written. Two inputs that decode to the same value have the same canonical form, so the hash a
// confirmation is bound to does not depend on how a client spaced or ordered its request.
func CanonicalInput(v any) (json.RawMessage, error) {
	raw, ok := v.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("iam: canonical input: %w", err)
		}
		raw = b
	}
	if len(raw) == 0 {
		raw = json.RawMessage("null")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil, fmt.Errorf("iam: the request's input is not JSON: %w", err)
	}
	if !atEnd(dec) {
		return nil, errors.New("iam: the request's input: data after the JSON value")
	}
	b, err := json.Marshal(x) // maps marshal with sorted keys
	return b, err
}

// InputHash is what a confirmation is bound to: the hash of the method and its canonical input.
func InputHash(method string, input json.RawMessage) (string, json.RawMessage, error) {
	canon, err := CanonicalInput(input)
	if err != nil {
		return "", nil, err
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil)), canon, nil
}

// consume spends one approved, unexpired confirmation of exactly r (its method and input) by
// agent, if there is one, and returns its id ("" if there is none).
func (l *Local) consume(ctx context.Context, agent string, r Request) (string, error) {
	hash, _, err := InputHash(r.Method, r.Input)
	if err != nil {
		return "", err
	}
	var id string
	err = l.db.Pool.QueryRow(ctx, `UPDATE iam.confirmations SET state = 'consumed', consumed_at = compute.compute_now()
		WHERE id = (SELECT id FROM iam.confirmations WHERE agent_id = $1 AND tenant_id = $2 AND action = $3 AND resource = $4
		            AND input_hash = $5 AND state = 'approved' AND expires_at > compute.compute_now()
		            ORDER BY requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id`,
		agent, r.TenantID, r.Action, r.Resource.String(), hash).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
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
	hash, input, err := InputHash(r.Method, r.Input)
	if err != nil {
		return Confirmation{}, err
	}
	var c Confirmation
	err = l.db.Tx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id FROM iam.confirmations WHERE agent_id = $1 AND tenant_id = $2 AND action = $3 AND resource = $4
			AND input_hash = $5 AND state = 'pending' AND expires_at > compute.compute_now() ORDER BY requested_at LIMIT 1`,
			p.ID, r.TenantID, r.Action, r.Resource.String(), hash).Scan(&c.ID)
		if errors.Is(err, pgx.ErrNoRows) {
			c.ID = newID("cfm")
			_, err = tx.Exec(ctx, `INSERT INTO iam.confirmations (id, delegation_id, agent_id, tenant_id, action, resource, method, input, input_hash, expires_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, compute.compute_now() + make_interval(secs => $10))`,
				c.ID, delegation, p.ID, r.TenantID, r.Action, r.Resource.String(), r.Method, string(input), hash, l.opts.ConfirmationTTL.Seconds())
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
	var res, input string
	err := l.db.Pool.QueryRow(ctx, `SELECT id, agent_id, tenant_id, action, resource, method, input, input_hash,
		       CASE WHEN state IN ('pending', 'approved') AND expires_at <= compute.compute_now() THEN 'expired' ELSE state END,
		       expires_at, coalesce(decided_by, ''), decided_at
		FROM iam.confirmations WHERE id = $1`, id).Scan(&c.ID, &c.AgentID, &c.Request.TenantID, &c.Request.Action, &res,
		&c.Request.Method, &input, &c.InputHash, &c.State, &c.ExpiresAt, &c.DecidedBy, &c.DecidedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("iam: confirmation %q: %w", id, ErrNotFound)
	}
	c.Request.Resource = parseResource(res)
	c.Request.Input = json.RawMessage(input)
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
// may give it, only once, and only before it expires.
func (l *Local) DecideConfirmation(ctx context.Context, id, personID string, approve bool) error {
	state := "denied"
	if approve {
		state = "approved"
	}
	tag, err := l.db.Pool.Exec(ctx, `UPDATE iam.confirmations c SET state = $3, decided_at = compute.compute_now(), decided_by = $2
		FROM iam.delegations d WHERE c.id = $1 AND d.id = c.delegation_id AND d.person_id = $2 AND c.state = 'pending'
		  AND c.expires_at > compute.compute_now()`, id, personID, state)
	if err != nil {
		return fmt.Errorf("iam: decide confirmation: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("iam: confirmation %q is not pending (or has expired) for person %s: %w", id, personID, ErrNotFound)
	}
	return nil
}
