package nodes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/modules"
)

// TokenPrefix starts every join token, so that one is recognised in a log or a paste.
const TokenPrefix = "bcjoin_"

func newJoinToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func hashToken(t string) []byte {
	h := sha256.Sum256([]byte(t))
	return h[:]
}

const joinTokenColumns = `id::text, tenant_id, pool_id::text, description, hint, max_uses, uses_left, expires_at, revoked_at, created_by, created_at, coalesce(node_id::text, '')`

func scanJoinToken(row pgx.Row) (api.JoinToken, error) {
	var t api.JoinToken
	err := row.Scan(&t.ID, &t.TenantID, &t.PoolID, &t.Description, &t.Hint, &t.MaxUses, &t.UsesLeft, &t.ExpiresAt, &t.RevokedAt, &t.CreatedBy, &t.CreatedAt, &t.NodeID)
	return t, err
}

// takeoverNode resolves the node a takeover token is for, in the token's pool.
func takeoverNode(ctx context.Context, tx pgx.Tx, pool, ref string) (*string, error) {
	if ref == "" {
		return nil, nil
	}
	var id string
	err := tx.QueryRow(ctx, `SELECT id::text FROM compute.nodes WHERE pool_id = $1 AND state <> 'retired'
		AND (name = $2 OR id::text = $2)`, pool, strings.ToLower(ref)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, api.InvalidField("node", "the pool has no node %q that could be taken over (it must exist and not be retired)", ref)
	}
	return &id, err
}

func registerJoinTokens(r *modules.Registry, m *Module) {
	modules.Handle(r, api.JoinTokensCreate, nil, func(ctx context.Context, c *modules.Call, in api.CreateJoinToken) (api.JoinToken, error) {
		pool, err := fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
		if err != nil {
			return api.JoinToken{}, err
		}
		ttl := api.DefaultJoinTokenTTL
		if in.TTL != "" {
			ttl, _ = api.ParseDuration("ttl", in.TTL)
		}
		uses := max(in.MaxUses, 1)
		node, err := takeoverNode(ctx, c.Tx, pool, in.Node)
		if err != nil {
			return api.JoinToken{}, err
		}
		token := newJoinToken()
		t, err := scanJoinToken(c.Tx.QueryRow(ctx, `INSERT INTO compute.join_tokens (id, tenant_id, pool_id, token_hash, hint, description, max_uses, uses_left, expires_at, created_by, node_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $7, compute.compute_now() + make_interval(secs => $8), $9, $10) RETURNING `+joinTokenColumns,
			fleet.NewID(), c.Target.TenantID, pool, hashToken(token), token[len(token)-6:], in.Description, uses, ttl.Seconds(), c.Principal.ID, node))
		t.Token = token
		if a, aerr := m.Authority(); aerr == nil {
			t.CAHash = CAHash(a.Certificate())
		}
		return t, err
	})

	modules.Handle(r, api.JoinTokensList, nil, func(ctx context.Context, c *modules.Call, in api.ListJoinTokens) (api.Page[api.JoinToken], error) {
		var pool *string
		if in.Pool != "" {
			id, err := fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
			if err != nil {
				return api.Page[api.JoinToken]{}, err
			}
			pool = &id
		}
		return fleet.Paginate(ctx, c.Tx, in.PageRequest, scanJoinToken, func(t api.JoinToken) string { return t.ID },
			`SELECT `+joinTokenColumns+` FROM compute.join_tokens WHERE tenant_id = $3 AND ($4::uuid IS NULL OR pool_id = $4)
			 AND ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2`, c.Target.TenantID, pool)
	})

	modules.Handle(r, api.JoinTokensRevoke,
		func(ctx context.Context, l modules.Lookup, in api.RevokeJoinToken) (modules.Target, error) {
			t := modules.Target{Existing: true, Kind: "join token", Ref: in.Token, ResourceID: in.Token}
			if !fleet.IsID(in.Token) {
				return t, api.InvalidField("token", "must be a join token's id (not the token itself)")
			}
			err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.join_tokens WHERE id = $1`, in.Token).Scan(&t.TenantID)
			if errors.Is(err, pgx.ErrNoRows) {
				return t, api.NotFound("join token", in.Token)
			}
			return t, err
		},
		func(ctx context.Context, c *modules.Call, in api.RevokeJoinToken) (api.JoinToken, error) {
			return scanJoinToken(c.Tx.QueryRow(ctx, `UPDATE compute.join_tokens SET revoked_at = coalesce(revoked_at, compute.compute_now())
				WHERE id = $1 AND tenant_id = $2 RETURNING `+joinTokenColumns, in.Token, c.Target.TenantID))
		})
}

// joinError says why a token was refused, without revealing more than the caller sent.
func joinError(ctx context.Context, tx pgx.Tx, token string) error {
	if !strings.HasPrefix(token, TokenPrefix) {
		return errors.New("not a join token (they start with " + TokenPrefix + ")")
	}
	var revoked, expired bool
	var left int
	err := tx.QueryRow(ctx, `SELECT revoked_at IS NOT NULL, expires_at <= compute.compute_now(), uses_left FROM compute.join_tokens WHERE token_hash = $1`,
		hashToken(token)).Scan(&revoked, &expired, &left)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return errors.New("unknown join token")
	case err != nil:
		return err
	case revoked:
		return errors.New("the join token was revoked")
	case expired:
		return errors.New("the join token has expired")
	case left == 0:
		return errors.New("the join token has been used up")
	}
	return errors.New("the join token was refused")
}
