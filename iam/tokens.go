package iam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// Token is a short-lived credential other than an API key. Token (the secret) is set only when
// it is issued.
type Token struct {
	ID        string    `json:"id"`
	Kind      TokenKind `json:"kind"`
	ExpiresAt time.Time `json:"expiresAt"`
	Token     string    `json:"token,omitempty"`
}

func (l *Local) issue(ctx context.Context, kind TokenKind, identity, role, delegation string, ttl time.Duration) (Token, error) {
	if ttl <= 0 || ttl > 30*24*time.Hour {
		return Token{}, fmt.Errorf("iam: a token lives between a second and 30 days, not %s", ttl)
	}
	secret := NewToken(kind)
	t := Token{ID: newID("tok"), Kind: kind, Token: secret}
	var roleArg, delegationArg *string
	if role != "" {
		roleArg = &role
	}
	if delegation != "" {
		delegationArg = &delegation
	}
	err := l.db.Pool.QueryRow(ctx, `INSERT INTO iam.tokens (id, kind, token_hash, identity_id, role_id, delegation_id, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, compute.compute_now() + make_interval(secs => $7)) RETURNING expires_at`,
		t.ID, kind, HashToken(secret), identity, roleArg, delegationArg, ttl.Seconds()).Scan(&t.ExpiresAt)
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		return Token{}, fmt.Errorf("iam: issue a %s token for %s: %w", kind, identity, ErrNotFound)
	}
	return t, err
}

// CreateSession issues a session token (biam_ses_) for an identity, as a login would.
func (l *Local) CreateSession(ctx context.Context, identityID string, ttl time.Duration) (Token, error) {
	return l.issue(ctx, TokenSession, identityID, "", "", ttl)
}

// IssueSTS issues short-lived security credentials (biam_sts_) for an identity.
func (l *Local) IssueSTS(ctx context.Context, identityID string, ttl time.Duration) (Token, error) {
	return l.issue(ctx, TokenSTS, identityID, "", "", ttl)
}

// AssumeRole issues a role token (biam_rol_): decisions made with it use that role alone. The
// identity must be bound to the role.
func (l *Local) AssumeRole(ctx context.Context, identityID, roleID string, ttl time.Duration) (Token, error) {
	var bound bool
	if err := l.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM iam.bindings WHERE identity_id = $1 AND role_id = $2)`, identityID, roleID).Scan(&bound); err != nil {
		return Token{}, err
	}
	if !bound {
		return Token{}, fmt.Errorf("iam: %s is not bound to role %s, so it cannot assume it", identityID, roleID)
	}
	return l.issue(ctx, TokenRole, identityID, roleID, "", ttl)
}

// IssueDelegationToken issues a delegation token (biam_dlg_): the agent of the delegation acting
// under it.
func (l *Local) IssueDelegationToken(ctx context.Context, delegationID string, ttl time.Duration) (Token, error) {
	var agent string
	err := l.db.Pool.QueryRow(ctx, `SELECT agent_id FROM iam.delegations WHERE id = $1 AND revoked_at IS NULL`, delegationID).Scan(&agent)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("iam: delegation %q: %w", delegationID, ErrNotFound)
	}
	if err != nil {
		return Token{}, err
	}
	return l.issue(ctx, TokenDelegation, agent, "", delegationID, ttl)
}

// RevokeToken revokes a token: it stops authenticating at once.
func (l *Local) RevokeToken(ctx context.Context, tokenID string) error {
	return l.revoke(ctx, "token", EventTokenRevoked, `UPDATE iam.tokens t SET revoked_at = coalesce(t.revoked_at, compute.compute_now())
		FROM iam.identities i WHERE t.id = $1 AND i.id = t.identity_id RETURNING t.identity_id, i.tenant_id`, tokenID)
}

// authenticateToken authenticates a token of a kind other than key.
func (l *Local) authenticateToken(ctx context.Context, kind TokenKind, hash []byte) (Principal, bool, bool, *float64, error) {
	var p Principal
	var expired, revoked bool
	var left *float64
	var role, delegation *string
	err := l.db.Pool.QueryRow(ctx, `
		SELECT i.id, i.kind, i.tenant_id, i.name, t.id, t.role_id, t.delegation_id,
		       t.expires_at <= compute.compute_now(), t.revoked_at IS NOT NULL,
		       extract(epoch FROM t.expires_at - compute.compute_now())::float8
		FROM iam.tokens t JOIN iam.identities i ON i.id = t.identity_id
		WHERE t.token_hash = $1 AND t.kind = $2`, hash, kind).
		Scan(&p.ID, &p.Kind, &p.TenantID, &p.Name, &p.KeyID, &role, &delegation, &expired, &revoked, &left)
	if role != nil {
		p.RoleID = *role
	}
	if delegation != nil {
		p.DelegationID = *delegation
	}
	p.TokenKind = kind
	return p, expired, revoked, left, err
}
