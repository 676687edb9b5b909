package iam

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the schema of the embedded IAM. It builds on postgres.Core.
var Migrations = postgres.EmbeddedMigrations("iam", "iam", migrationsFS)

// EmbeddedOptions configure the embedded IAM.
type EmbeddedOptions struct {
	// RootTenantID is the id of the root (platform) tenant, created by Initialize when missing.
	RootTenantID string
	// RootTenantName is its display name; default "root".
	RootTenantName string
	// CacheTTL is how long an authenticated API key and an identity's policies are reused before
	// they are read again; default DefaultEmbeddedCacheTTL, negative turns caching off. Changes
	// made through this Local (revoking a key, a new role or binding) clear the caches at once;
	// changes made by another process are seen within CacheTTL.
	CacheTTL time.Duration
	// ConfirmationTTL is how long a confirmation an agent asks for may be approved and then
	// spent; default DefaultConfirmationTTL.
	ConfirmationTTL time.Duration
}

// DefaultConfirmationTTL is how long a confirmation lives unless EmbeddedOptions say otherwise.
const DefaultConfirmationTTL = 15 * time.Minute

// Local is Better IAM run in-process on Better Compute's own database: the Port, plus the admin
// calls that create tenants, identities, keys, roles and bindings.
type Local struct {
	db   *postgres.DB
	opts EmbeddedOptions

	auth        *ttlCache[string, authEntry]        // by token hash
	policyCache *ttlCache[policyKey, []namedPolicy] // by identity and tenant
	pathCache   *ttlCache[string, []string]         // tenant paths, by tenant
	resolver    atomic.Pointer[Resolver]
}

type authEntry struct {
	p                Principal
	expired, revoked bool
}

type policyKey struct{ identity, tenant string }

var _ interface {
	Port
	Initializer
} = (*Local)(nil)

// Embedded returns the in-process IAM on db. It touches nothing until Initialize.
func Embedded(db *postgres.DB, opts EmbeddedOptions) (*Local, error) {
	if db == nil {
		return nil, errors.New("iam.Embedded: db is nil")
	}
	if opts.RootTenantID == "" {
		return nil, errors.New("iam.Embedded: EmbeddedOptions.RootTenantID is required")
	}
	if !tenantIDRE.MatchString(opts.RootTenantID) {
		return nil, fmt.Errorf("iam.Embedded: EmbeddedOptions.RootTenantID %q is not a valid tenant id (letters, digits and '_.:-', 128 at most)", opts.RootTenantID)
	}
	if opts.RootTenantName == "" {
		opts.RootTenantName = "root"
	}
	if opts.CacheTTL == 0 {
		opts.CacheTTL = DefaultEmbeddedCacheTTL
	}
	if opts.ConfirmationTTL <= 0 {
		opts.ConfirmationTTL = DefaultConfirmationTTL
	}
	return &Local{db: db, opts: opts,
		auth:        newTTLCache[string, authEntry](opts.CacheTTL, 100_000),
		policyCache: newTTLCache[policyKey, []namedPolicy](opts.CacheTTL, 100_000),
		pathCache:   newTTLCache[string, []string](opts.CacheTTL, 100_000),
	}, nil
}

// Initialize applies the IAM's migrations and creates the root tenant when it is missing.
func (l *Local) Initialize(ctx context.Context) error {
	if err := postgres.Migrate(ctx, l.db, postgres.Core, Migrations); err != nil {
		return fmt.Errorf("iam: %w", err)
	}
	_, err := l.db.Pool.Exec(ctx, `INSERT INTO iam.tenants (id, kind, name) VALUES ($1, 'root', $2)
		ON CONFLICT DO NOTHING`, l.opts.RootTenantID, l.opts.RootTenantName)
	if err != nil {
		return fmt.Errorf("iam: create the root tenant: %w", err)
	}
	var root string
	if err := l.db.Pool.QueryRow(ctx, `SELECT id FROM iam.tenants WHERE kind = 'root'`).Scan(&root); err != nil {
		return fmt.Errorf("iam: read the root tenant: %w", err)
	}
	if root != l.opts.RootTenantID {
		return fmt.Errorf("iam: this database's root tenant is %q, not %q as RootTenantID says", root, l.opts.RootTenantID)
	}
	return nil
}

// RootTenantID is the id of the root tenant.
func (l *Local) RootTenantID() string { return l.opts.RootTenantID }

// Authenticate implements Port.
func (l *Local) Authenticate(ctx context.Context, credential string) (Principal, error) {
	if credential == "" {
		return Principal{}, fmt.Errorf("%w: no credential", ErrUnauthenticated)
	}
	kind, err := ParseToken(credential)
	if err != nil {
		return Principal{}, err
	}
	hash := string(HashToken(credential))
	e, gen, cached := l.auth.get(hash)
	p, expired, revoked := e.p, e.expired, e.revoked
	if !cached {
		var left *float64 // seconds until the credential expires, by the database's clock
		if kind == TokenAPIKey {
			err = l.db.Pool.QueryRow(ctx, `
				SELECT i.id, i.kind, i.tenant_id, i.name, k.id,
				       k.expires_at IS NOT NULL AND k.expires_at <= compute.compute_now(),
				       k.revoked_at IS NOT NULL, extract(epoch FROM k.expires_at - compute.compute_now())::float8
				FROM iam.api_keys k JOIN iam.identities i ON i.id = k.identity_id
				WHERE k.token_hash = $1`, []byte(hash)).
				Scan(&p.ID, &p.Kind, &p.TenantID, &p.Name, &p.KeyID, &expired, &revoked, &left)
			p.TokenKind = TokenAPIKey
		} else {
			p, expired, revoked, left, err = l.authenticateToken(ctx, kind, []byte(hash))
		}
		if err == nil && !expired && !revoked {
			// A key is reused until it would expire, and never past the TTL.
			var until time.Time
			if left != nil {
				until = time.Now().Add(time.Duration(*left * float64(time.Second)))
			}
			l.auth.put(hash, authEntry{p: p}, gen, until)
		}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Principal{}, fmt.Errorf("%w: unknown %s", ErrUnauthenticated, kindName(kind))
	case err != nil:
		return Principal{}, fmt.Errorf("iam: authenticate: %w", err)
	case revoked:
		return Principal{}, fmt.Errorf("%w: %s %s was revoked", ErrUnauthenticated, kindName(kind), p.KeyID)
	case expired:
		return Principal{}, fmt.Errorf("%w: %s %s has expired", ErrUnauthenticated, kindName(kind), p.KeyID)
	}
	p.Credential = credential
	return p, nil
}

// Authorize implements Port.
func (l *Local) Authorize(ctx context.Context, p Principal, r Request) (Decision, error) {
	ds, err := l.AuthorizeMany(ctx, p, []Request{r})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// AuthorizeMany implements Port. The policies of the principal's bindings are read once per
// tenant asked about.
func (l *Local) AuthorizeMany(ctx context.Context, p Principal, rs []Request) ([]Decision, error) {
	type tenantPolicies struct {
		pols  []namedPolicy
		needs bool // whether a policy could use the resource's attributes
	}
	out := make([]Decision, len(rs))
	byTenant := map[string]tenantPolicies{}
	for i, r := range rs {
		tp, ok := byTenant[r.TenantID]
		if !ok {
			pols, err := l.policies(ctx, p.ID, r.TenantID)
			if err != nil {
				return nil, err
			}
			if p.RoleID != "" { // an assumed role: that role alone
				pols = onlyRole(pols, p.RoleID)
			}
			tp = tenantPolicies{pols, needsResource(pols)}
			byTenant[r.TenantID] = tp
		}
		var attrs map[string]any
		if tp.needs {
			var err error
			if attrs, err = l.attributes(ctx, p, r); err != nil {
				return nil, err
			}
		} else {
			attrs = Attributes(p, r, nil)
		}
		out[i] = evaluate(tp.pols, r, attrs)
		if out[i].Allowed && p.Kind == KindAgent {
			d, err := l.confirmed(ctx, p, r, out[i])
			if err != nil {
				return nil, err
			}
			out[i] = d
		}
	}
	return out, nil
}

// confirmed applies an agent's delegation: an action it reserves is allowed only by consuming
// one confirmation the person approved.
func (l *Local) confirmed(ctx context.Context, p Principal, r Request, d Decision) (Decision, error) {
	_, reserved, err := l.confirmFor(ctx, p.ID, r.Action)
	if err != nil || !reserved {
		return d, err
	}
	id, err := l.consume(ctx, p.ID, r)
	if err != nil {
		return Decision{}, err
	}
	if id != "" {
		d.Reason, d.Confirmed = "allowed, with a person's confirmation", id
		return d, nil
	}
	return Decision{Allowed: false, ConfirmationRequired: true, Matched: d.Matched,
		Reason: "the agent's delegation reserves " + r.Action + " for its person's confirmation"}, nil
}

// policies returns the policies bound to identity in tenant or any of its ancestors.
func (l *Local) policies(ctx context.Context, identity, tenant string) ([]namedPolicy, error) {
	k := policyKey{identity, tenant}
	pols, gen, ok := l.policyCache.get(k)
	if ok {
		return pols, nil
	}
	pols, err := l.readPolicies(ctx, identity, tenant)
	if err == nil {
		l.policyCache.put(k, pols, gen, time.Time{})
	}
	return pols, err
}

func (l *Local) readPolicies(ctx context.Context, identity, tenant string) ([]namedPolicy, error) {
	path, err := l.TenantPath(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := l.db.Pool.Query(ctx, `
		SELECT r.id, r.name, r.policy FROM iam.bindings b JOIN iam.roles r ON r.id = b.role_id
		WHERE b.identity_id = $1 AND b.tenant_id = ANY($2)
		ORDER BY r.id`, identity, path)
	if err != nil {
		return nil, fmt.Errorf("iam: read policies: %w", err)
	}
	var out []namedPolicy
	for rows.Next() {
		var id, name string
		var doc []byte
		if err := rows.Scan(&id, &name, &doc); err != nil {
			return nil, err
		}
		pol, err := ParsePolicy(doc)
		if err != nil {
			// A stored policy was checked when written; one that no longer parses denies nothing
			// and allows nothing, and says so.
			return nil, fmt.Errorf("iam: role %s: %w", name, err)
		}
		out = append(out, namedPolicy{id: id, name: name, policy: pol})
	}
	return out, rows.Err()
}

// RegisterCatalog implements Port: it adds or updates the resource types and actions.
func (l *Local) RegisterCatalog(ctx context.Context, c Catalog) error {
	return l.db.Tx(ctx, func(tx pgx.Tx) error {
		for _, t := range c.ResourceTypes {
			if _, err := tx.Exec(ctx, `INSERT INTO iam.resource_types (name, description) VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET description = excluded.description`, t.Name, t.Description); err != nil {
				return fmt.Errorf("iam: register resource type %s: %w", t.Name, err)
			}
		}
		for _, a := range c.Actions {
			if _, err := tx.Exec(ctx, `INSERT INTO iam.actions (name, resource_type, description) VALUES ($1, $2, $3)
				ON CONFLICT (name) DO UPDATE SET resource_type = excluded.resource_type, description = excluded.description`,
				a.Name, a.ResourceType, a.Description); err != nil {
				return fmt.Errorf("iam: register action %s: %w", a.Name, err)
			}
		}
		return nil
	})
}

// Catalog returns the registered resource types and actions.
func (l *Local) Catalog(ctx context.Context) (Catalog, error) {
	var c Catalog
	rows, err := l.db.Pool.Query(ctx, `SELECT name, description FROM iam.resource_types ORDER BY name`)
	if err != nil {
		return c, err
	}
	c.ResourceTypes, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ResourceType])
	if err != nil {
		return c, err
	}
	rows, err = l.db.Pool.Query(ctx, `SELECT name, resource_type, description FROM iam.actions ORDER BY name`)
	if err != nil {
		return c, err
	}
	c.Actions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Action])
	return c, err
}

// Resolver tells IAM about application-owned resources (compute-pool/…): the attributes that
// conditions see as resource.*. Better Compute resolves its own, from its tables.
type Resolver interface {
	ResolveResource(ctx context.Context, r Resource) (map[string]any, error)
}

// ResolverSetter is a port that decides with application-owned resources' attributes. Better
// Compute gives such a port its resolver at Initialize.
type ResolverSetter interface {
	SetResolver(Resolver)
}

// SetResolver implements ResolverSetter.
func (l *Local) SetResolver(r Resolver) { l.resolver.Store(&r) }

func (l *Local) attributes(ctx context.Context, p Principal, r Request) (map[string]any, error) {
	var res map[string]any
	if rp := l.resolver.Load(); rp != nil && r.Resource.ID != "*" && r.Resource.ID != "" {
		var err error
		if res, err = (*rp).ResolveResource(ctx, r.Resource); err != nil {
			return nil, fmt.Errorf("iam: resolve %s: %w", r.Resource, err)
		}
	}
	return Attributes(p, r, res), nil
}

func onlyRole(pols []namedPolicy, role string) []namedPolicy {
	var out []namedPolicy
	for _, p := range pols {
		if p.id == role {
			out = append(out, p)
		}
	}
	return out
}

func kindName(k TokenKind) string {
	switch k {
	case TokenAPIKey:
		return "API key"
	case TokenSession:
		return "session"
	case TokenRole:
		return "role token"
	case TokenSTS:
		return "STS token"
	case TokenDelegation:
		return "delegation token"
	}
	return "token"
}

// needsResource reports whether any statement has conditions or refers to resource attributes.
func needsResource(pols []namedPolicy) bool {
	for _, p := range pols {
		for _, s := range p.policy.Statements {
			if len(s.Conditions) > 0 {
				return true
			}
			for _, pat := range append(append([]string(nil), s.Actions...), s.Resources...) {
				if strings.Contains(pat, "${resource.") {
					return true
				}
			}
		}
	}
	return false
}
