package iam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

var tenantIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// newID returns a new id with a type prefix, time-ordered (UUIDv7), e.g. idn_0192f….
func newID(prefix string) string {
	return prefix + "_" + strings.ReplaceAll(uuid.Must(uuid.NewV7()).String(), "-", "")
}

// Tenant is a node of the tenant tree: root → organization → project.
type Tenant struct {
	ID        string    `json:"id"`
	ParentID  string    `json:"parentId,omitempty"`
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
}

// CreateTenant is the input of Local.CreateTenant.
type CreateTenant struct {
	ID       string // optional; a new id when empty
	ParentID string // required
	Kind     string // organization or project; default: organization under the root, project below
	Name     string
}

// CreateTenant adds a tenant under a parent.
func (l *Local) CreateTenant(ctx context.Context, in CreateTenant) (Tenant, error) {
	if in.ID == "" {
		in.ID = newID("ten")
	}
	if !tenantIDRE.MatchString(in.ID) {
		return Tenant{}, fmt.Errorf("iam: tenant id %q is not valid (letters, digits and '_.:-', 128 at most)", in.ID)
	}
	if in.ParentID == "" {
		return Tenant{}, errors.New("iam: a tenant needs a ParentID")
	}
	if in.Name == "" {
		in.Name = in.ID
	}
	var parentKind string
	if err := l.db.Pool.QueryRow(ctx, `SELECT kind FROM iam.tenants WHERE id = $1`, in.ParentID).Scan(&parentKind); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Tenant{}, fmt.Errorf("iam: parent tenant %q: %w", in.ParentID, ErrNotFound)
		}
		return Tenant{}, err
	}
	if in.Kind == "" {
		in.Kind = map[string]string{"root": "organization", "organization": "project", "project": "project"}[parentKind]
	}
	if in.Kind != "organization" && in.Kind != "project" {
		return Tenant{}, fmt.Errorf("iam: tenant kind must be organization or project, got %q", in.Kind)
	}
	var t Tenant
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO iam.tenants (id, parent_id, kind, name) VALUES ($1, $2, $3, $4)
			RETURNING id, parent_id, kind, name, created_at`, in.ID, in.ParentID, in.Kind, in.Name).
			Scan(&t.ID, &t.ParentID, &t.Kind, &t.Name, &t.CreatedAt)
		if err != nil {
			return err
		}
		return l.event(ctx, tx, EventTenantCreated, t.ID, t.ID, map[string]any{"parent": t.ParentID, "kind": t.Kind})
	})
	if postgres.ErrorCode(err) == postgres.UniqueViolation {
		return Tenant{}, fmt.Errorf("iam: tenant %q already exists", in.ID)
	}
	if err != nil {
		return Tenant{}, err
	}
	l.pathCache.clear()
	return t, nil
}

// Identity is a user, service or agent in one tenant.
type Identity struct {
	ID        string       `json:"id"`
	TenantID  string       `json:"tenantId"`
	Kind      IdentityKind `json:"kind"`
	Name      string       `json:"name"`
	CreatedAt time.Time    `json:"createdAt"`
}

// CreateIdentity adds an identity to a tenant.
func (l *Local) CreateIdentity(ctx context.Context, tenantID string, kind IdentityKind, name string) (Identity, error) {
	switch kind {
	case KindUser, KindService, KindAgent:
	default:
		return Identity{}, fmt.Errorf("iam: identity kind must be user, service or agent, got %q", kind)
	}
	if name == "" {
		return Identity{}, errors.New("iam: an identity needs a name")
	}
	var id Identity
	err := l.db.Pool.QueryRow(ctx, `INSERT INTO iam.identities (id, tenant_id, kind, name) VALUES ($1, $2, $3, $4)
		RETURNING id, tenant_id, kind, name, created_at`, newID("idn"), tenantID, kind, name).
		Scan(&id.ID, &id.TenantID, &id.Kind, &id.Name, &id.CreatedAt)
	switch postgres.ErrorCode(err) {
	case postgres.UniqueViolation:
		return Identity{}, fmt.Errorf("iam: tenant %s already has an identity named %q", tenantID, name)
	case postgres.ForeignKeyViolation:
		return Identity{}, fmt.Errorf("iam: tenant %q: %w", tenantID, ErrNotFound)
	}
	return id, err
}

// APIKey is a key of a service or agent. Token is set only in the answer of CreateAPIKey: it is
// shown once and only its hash is stored.
type APIKey struct {
	ID         string     `json:"id"`
	IdentityID string     `json:"identityId"`
	Name       string     `json:"name,omitempty"`
	Hint       string     `json:"hint"`
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	Token      string     `json:"token,omitempty"`
}

// CreateAPIKey makes a key for a service or agent identity. A zero expires means it never expires.
func (l *Local) CreateAPIKey(ctx context.Context, identityID, name string, expires time.Time) (APIKey, error) {
	var kind IdentityKind
	if err := l.db.Pool.QueryRow(ctx, `SELECT kind FROM iam.identities WHERE id = $1`, identityID).Scan(&kind); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return APIKey{}, fmt.Errorf("iam: identity %q: %w", identityID, ErrNotFound)
		}
		return APIKey{}, err
	}
	if kind == KindUser {
		return APIKey{}, fmt.Errorf("iam: identity %s is a user; API keys go to services and agents only", identityID)
	}
	token := NewToken(TokenAPIKey)
	k := APIKey{ID: newID("key"), IdentityID: identityID, Name: name, Hint: token[len(token)-10 : len(token)-6], Token: token}
	var exp *time.Time
	if !expires.IsZero() {
		exp = &expires
	}
	err := l.db.Pool.QueryRow(ctx, `INSERT INTO iam.api_keys (id, identity_id, identity_kind, name, token_hash, hint, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING created_at, expires_at`,
		k.ID, identityID, kind, name, HashToken(token), k.Hint, exp).Scan(&k.CreatedAt, &k.ExpiresAt)
	if err != nil {
		return APIKey{}, fmt.Errorf("iam: create API key: %w", err)
	}
	return k, nil
}

// RevokeAPIKey revokes a key: it stops authenticating at once.
func (l *Local) RevokeAPIKey(ctx context.Context, keyID string) error {
	return l.revoke(ctx, "API key", EventKeyRevoked, `UPDATE iam.api_keys k SET revoked_at = coalesce(k.revoked_at, compute.compute_now())
		FROM iam.identities i WHERE k.id = $1 AND i.id = k.identity_id RETURNING k.identity_id, i.tenant_id`, keyID)
}

// revoke runs a revocation that returns the credential's identity and tenant, with its event, in
// one transaction; then the credential stops authenticating here at once.
func (l *Local) revoke(ctx context.Context, what, event, query, id string) error {
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		var identity, tenant string
		if err := tx.QueryRow(ctx, query, id).Scan(&identity, &tenant); err != nil {
			return err
		}
		return l.event(ctx, tx, event, tenant, identity, map[string]any{"id": id})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("iam: %s %q: %w", what, id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("iam: revoke %s %s: %w", what, id, err)
	}
	l.auth.clear()
	return nil
}

// Role is a named policy of a tenant.
type Role struct {
	ID       string `json:"id"`
	TenantID string `json:"tenantId"`
	Name     string `json:"name"`
	Policy   Policy `json:"policy"`
}

// CreateRole stores a role after checking its policy.
func (l *Local) CreateRole(ctx context.Context, tenantID, name string, policy Policy) (Role, error) {
	if name == "" {
		return Role{}, errors.New("iam: a role needs a name")
	}
	if err := policy.Validate(); err != nil {
		return Role{}, fmt.Errorf("iam: role %q: %w", name, err)
	}
	doc, err := json.Marshal(policy)
	if err != nil {
		return Role{}, err
	}
	// No cache to clear: a role decides nothing until it is bound.
	r := Role{ID: newID("rol"), TenantID: tenantID, Name: name, Policy: policy}
	_, err = l.db.Pool.Exec(ctx, `INSERT INTO iam.roles (id, tenant_id, name, policy) VALUES ($1, $2, $3, $4)`, r.ID, tenantID, name, doc)
	switch postgres.ErrorCode(err) {
	case postgres.UniqueViolation:
		return Role{}, fmt.Errorf("iam: tenant %s already has a role named %q", tenantID, name)
	case postgres.ForeignKeyViolation:
		return Role{}, fmt.Errorf("iam: tenant %q: %w", tenantID, ErrNotFound)
	}
	return r, err
}

// Bind gives identity the role in tenant and all its descendants.
func (l *Local) Bind(ctx context.Context, identityID, roleID, tenantID string) error {
	defer l.policyCache.clear()
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO iam.bindings (id, identity_id, role_id, tenant_id) VALUES ($1, $2, $3, $4)
			ON CONFLICT (identity_id, role_id, tenant_id) DO NOTHING`, newID("bnd"), identityID, roleID, tenantID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return l.event(ctx, tx, EventBindingCreated, tenantID, identityID, map[string]any{"role": roleID})
	})
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		return fmt.Errorf("iam: bind %s to %s in %s: %w", identityID, roleID, tenantID, ErrNotFound)
	}
	return err
}

// AdminPolicy allows every action on every resource.
var AdminPolicy = Policy{Version: 1, Statements: []Statement{{Sid: "all", Effect: Allow, Actions: []string{"*"}, Resources: []string{"*"}}}}

// CreateAdminKey makes a service identity named name in tenantID (or reuses it), binds it to an
// administrator role of that tenant and returns a new key for it. The devserver and tests use it;
// a production deployment grants narrower roles.
func (l *Local) CreateAdminKey(ctx context.Context, tenantID, name string) (APIKey, error) {
	defer l.policyCache.clear()
	var identityID, roleID string
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		doc, _ := json.Marshal(AdminPolicy)
		err := tx.QueryRow(ctx, `INSERT INTO iam.roles (id, tenant_id, name, policy) VALUES ($1, $2, 'admin', $3)
			ON CONFLICT (tenant_id, name) DO UPDATE SET name = excluded.name RETURNING id`, newID("rol"), tenantID, doc).Scan(&roleID)
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `INSERT INTO iam.identities (id, tenant_id, kind, name) VALUES ($1, $2, 'service', $3)
			ON CONFLICT (tenant_id, name) DO UPDATE SET name = excluded.name RETURNING id`, newID("idn"), tenantID, name).Scan(&identityID)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO iam.bindings (id, identity_id, role_id, tenant_id) VALUES ($1, $2, $3, $4)
			ON CONFLICT DO NOTHING`, newID("bnd"), identityID, roleID, tenantID)
		return err
	})
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		return APIKey{}, fmt.Errorf("iam: tenant %q: %w", tenantID, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("iam: admin key: %w", err)
	}
	return l.CreateAPIKey(ctx, identityID, name, time.Time{})
}
