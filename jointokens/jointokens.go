// Package jointokens is the joinTokens API group as a module: tokens that admit machines into a
// pool (compute.join_tokens, which it alone writes), and the join credential they are (the
// "bcjoin_" prefix) that the core's JoinService spends. It uses the core only through
// modules.Runtime and imports nothing from internal/: it is the proof that a group can live
// outside the core, and the model for a host's own module.
package jointokens

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the module's schema.
var Migrations = postgres.EmbeddedMigrations("jointokens", "compute", migrationsFS)

// Prefix starts every join token, so that one is recognised in a log or a paste.
const Prefix = "bcjoin_"

// Module is the join tokens module. compute.New always registers it: JoinService needs it.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "jointokens" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceJoinToken, Description: "A token that admits machines into a pool."})
	r.Actions(modules.ActionsFor(api.JoinTokenMethods()...)...)
	r.JoinCredentials(modules.JoinCredential{Prefix: Prefix, Spend: spend})
	modules.Handle(r, api.JoinTokensCreate, nil, create)
	modules.Handle(r, api.JoinTokensList, nil, list)
	modules.Handle(r, api.JoinTokensRevoke, revokeTarget, revoke)
	return nil
}

const columns = `id::text, tenant_id, pool_id::text, description, hint, max_uses, uses_left, expires_at, revoked_at, created_by, created_at, coalesce(node_id::text, ''), role`

func scan(row pgx.Row) (api.JoinToken, error) {
	var t api.JoinToken
	err := row.Scan(&t.ID, &t.TenantID, &t.PoolID, &t.Description, &t.Hint, &t.MaxUses, &t.UsesLeft, &t.ExpiresAt, &t.RevokedAt, &t.CreatedBy, &t.CreatedAt, &t.NodeID, &t.Role)
	return t, err
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return Prefix + base64.RawURLEncoding.EncodeToString(b)
}

func hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

func create(ctx context.Context, c *modules.Call, in api.CreateJoinToken) (api.JoinToken, error) {
	rt := c.Runtime
	pool, err := rt.Fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
	if err != nil {
		return api.JoinToken{}, err
	}
	ttl := api.DefaultJoinTokenTTL
	if in.TTL != "" {
		ttl, _ = api.ParseDuration("ttl", in.TTL)
	}
	var node *string
	if in.Node != "" {
		id, err := rt.Fleet.NodeID(ctx, c.Tx, pool, in.Node)
		if api.CodeOf(err) == api.CodeNotFound {
			return api.JoinToken{}, api.InvalidField("node", "the pool has no node %q that could be taken over (it must exist and not be retired)", in.Node)
		}
		if err != nil {
			return api.JoinToken{}, err
		}
		node = &id
	}
	role := cmp.Or(in.Role, api.RoleNode)
	if role == api.RoleSite {
		site, err := rt.Fleet.PoolSite(ctx, c.Tx, pool)
		if err != nil {
			return api.JoinToken{}, err
		}
		if site == "" {
			return api.JoinToken{}, api.InvalidField("pool", "a site token needs a pool of a site (pools.create with site); %q has none", in.Pool)
		}
	}
	token := newToken()
	t, err := scan(c.Tx.QueryRow(ctx, `INSERT INTO compute.join_tokens (id, tenant_id, pool_id, token_hash, hint, description, max_uses, uses_left, expires_at, created_by, node_id, role)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $7, compute.compute_now() + make_interval(secs => $8), $9, $10, $11) RETURNING `+columns,
		uuid.Must(uuid.NewV7()).String(), c.Target.TenantID, pool, hash(token), token[len(token)-6:], in.Description, max(in.MaxUses, 1), ttl.Seconds(), c.Principal.ID, node, role))
	if err != nil {
		return t, err
	}
	t.Token = token
	t.CAHash, err = rt.Fleet.CAHash()
	return t, err
}

// cursorKind versions the list's cursors.
const cursorKind = "jt1"

func list(ctx context.Context, c *modules.Call, in api.ListJoinTokens) (api.Page[api.JoinToken], error) {
	var pool *string
	if in.Pool != "" {
		id, err := c.Runtime.Fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
		if err != nil {
			return api.Page[api.JoinToken]{}, err
		}
		pool = &id
	}
	var after *string
	if in.Cursor != "" {
		key, err := api.DecodeIDCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.JoinToken]{}, err
		}
		after = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+columns+` FROM compute.join_tokens WHERE tenant_id = $1 AND ($2::uuid IS NULL OR pool_id = $2)
		AND ($3::uuid IS NULL OR id > $3) ORDER BY id LIMIT $4`, c.Target.TenantID, pool, after, limit+1)
	if err != nil {
		return api.Page[api.JoinToken]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.JoinToken, error) { return scan(r) })
	if err != nil {
		return api.Page[api.JoinToken]{}, err
	}
	page := api.Page[api.JoinToken]{Items: items}
	if len(items) > limit {
		page.Items = items[:limit]
		page.NextCursor = api.EncodeCursor(cursorKind, items[limit-1].ID)
	}
	return page, nil
}

func revokeTarget(ctx context.Context, l modules.Lookup, in api.RevokeJoinToken) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "join token", Ref: in.Token, ResourceID: in.Token}
	if uuid.Validate(in.Token) != nil {
		return t, api.InvalidField("token", "must be a join token's id (not the token itself)")
	}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.join_tokens WHERE id = $1`, in.Token).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("join token", in.Token)
	}
	return t, err
}

func revoke(ctx context.Context, c *modules.Call, in api.RevokeJoinToken) (api.JoinToken, error) {
	return scan(c.Tx.QueryRow(ctx, `UPDATE compute.join_tokens SET revoked_at = coalesce(revoked_at, compute.compute_now())
		WHERE id = $1 AND tenant_id = $2 RETURNING `+columns, in.Token, c.Target.TenantID))
}

// spend implements the join credential: one use of a live token, or why it was refused, saying
// no more than the machine sent.
func spend(ctx context.Context, tx pgx.Tx, token string) (modules.Admission, error) {
	var a modules.Admission
	var node *string
	err := tx.QueryRow(ctx, `UPDATE compute.join_tokens SET uses_left = uses_left - 1
		WHERE token_hash = $1 AND uses_left > 0 AND revoked_at IS NULL AND expires_at > compute.compute_now()
		RETURNING pool_id::text, tenant_id, node_id::text, role`, hash(token)).Scan(&a.PoolID, &a.TenantID, &node, &a.Role)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, refusal(ctx, tx, token)
	}
	if node != nil {
		a.NodeID = *node
	}
	return a, err
}

func refusal(ctx context.Context, tx pgx.Tx, token string) error {
	if !strings.HasPrefix(token, Prefix) {
		return &modules.JoinRefused{Reason: "not a join token (they start with " + Prefix + ")"}
	}
	var revoked, expired bool
	var left int
	err := tx.QueryRow(ctx, `SELECT revoked_at IS NOT NULL, expires_at <= compute.compute_now(), uses_left FROM compute.join_tokens WHERE token_hash = $1`,
		hash(token)).Scan(&revoked, &expired, &left)
	why := "the join token was refused"
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		why = "unknown join token"
	case err != nil:
		return err
	case revoked:
		why = "the join token was revoked"
	case expired:
		why = "the join token has expired"
	case left == 0:
		why = "the join token has been used up"
	}
	return &modules.JoinRefused{Reason: why}
}
