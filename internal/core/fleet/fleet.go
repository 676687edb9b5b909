// Package fleet owns the fleet tables (sites, pools, nodes) and serves the sites, pools and nodes
// API groups. It is the one writer of node rows: the gateway and nodes call its node writes.
package fleet

import (
	"context"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
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

// Migrations is the fleet's schema. It builds on postgres.Core.
var Migrations = postgres.EmbeddedMigrations("fleet", "compute", migrationsFS)

// Module registers the fleet's tables and groups. It is part of the core, always registered.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "fleet" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(
		iam.ResourceType{Name: api.ResourceSite, Description: "A site: where nodes live."},
		iam.ResourceType{Name: api.ResourcePool, Description: "A pool of nodes that capacity is requested from."},
		iam.ResourceType{Name: api.ResourceNode, Description: "A server that runs bcd."},
	)
	r.Actions(modules.ActionsFor(api.FleetMethods()...)...)
	registerSites(r)
	registerPools(r)
	registerNodes(r)
	registerResolvers(r)
	return nil
}

// NewID returns a new time-ordered id (UUIDv7), so that ordering by id is ordering by creation.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// IsID reports whether ref is an id rather than a name.
func IsID(ref string) bool {
	if len(ref) != 36 {
		return false
	}
	_, err := uuid.Parse(ref)
	return err == nil
}

// ref describes how to look up one kind of resource by id or by name.
type ref struct {
	kind   string // "pool"
	table  string // compute.pools
	byName string // the scope a name is unique in: "tenant_id::text" or "pool_id::uuid"
}

var (
	siteRef = ref{"site", "compute.sites", "tenant_id::text"}
	poolRef = ref{"pool", "compute.pools", "tenant_id::text"}
	nodeRef = ref{"node", "compute.nodes", "pool_id::uuid"}
)

// resolve finds the target named by name: an id anywhere, or a name within scope (a tenant, or a
// node's pool).
func (r ref) resolve(ctx context.Context, q postgres.Querier, scope, name string) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: r.kind, Ref: name}
	var row pgx.Row
	if IsID(name) {
		row = q.QueryRow(ctx, "SELECT id::text, tenant_id FROM "+r.table+" WHERE id = $1", name)
	} else {
		row = q.QueryRow(ctx, "SELECT id::text, tenant_id FROM "+r.table+" WHERE "+strings.Split(r.byName, "::")[0]+" = $1::"+strings.Split(r.byName, "::")[1]+" AND name = $2", scope, name)
	}
	err := row.Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound(r.kind, name)
	}
	return t, err
}

// inTenant resolves name within the tenant the input names, or the caller's.
func (r ref) inTenant(ctx context.Context, q postgres.Querier, p iam.Principal, tenant, name string) (modules.Target, error) {
	if tenant == "" {
		tenant = p.TenantID
	}
	return r.resolve(ctx, q, tenant, name)
}

// idIn resolves name to the id of a resource of the given tenant, inside a transaction.
func (r ref) idIn(ctx context.Context, q postgres.Querier, tenant, name string) (string, error) {
	t, err := r.resolve(ctx, q, tenant, name)
	if err != nil {
		return "", err
	}
	if t.TenantID != tenant {
		return "", api.NotFound(r.kind, name)
	}
	return t.ResourceID, nil
}

// Cursors are opaque to callers: the id of the last item of the page, encoded.
func encodeCursor(lastID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("v1:" + lastID))
}

func decodeCursor(c string) (*string, error) {
	if c == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	id, ok := strings.CutPrefix(string(b), "v1:")
	if err != nil || !ok || !IsID(id) {
		return nil, api.InvalidField("cursor", "is not a cursor returned by this API")
	}
	return &id, nil
}

// PoolID resolves a pool by id or name among a tenant's pools.
func PoolID(ctx context.Context, q postgres.Querier, tenant, ref string) (string, error) {
	return poolRef.idIn(ctx, q, tenant, ref)
}

// PoolSite returns the site of a pool, "" when it has none.
func PoolSite(ctx context.Context, q postgres.Querier, poolID string) (string, error) {
	var site *string
	err := q.QueryRow(ctx, `SELECT site_id::text FROM compute.pools WHERE id = $1`, poolID).Scan(&site)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", api.NotFound("pool", poolID)
	}
	if err != nil || site == nil {
		return "", err
	}
	return *site, nil
}

// SiteAgents returns the site agents of a site: the nodes of role site, not retired, in its pools.
func SiteAgents(ctx context.Context, q postgres.Querier, siteID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT n.id::text FROM compute.nodes n JOIN compute.pools p ON p.id = n.pool_id
		WHERE p.site_id = $1 AND n.role = 'site' AND n.state <> 'retired' ORDER BY n.status = 'online' DESC, n.id`, siteID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Paginate runs a keyset-paginated list query, as the fleet's own lists do: q selects rows
// ordered by id, with $1 the cursor (NULL for the first page) and $2 the limit plus one.
func Paginate[T any](ctx context.Context, tx pgx.Tx, req api.PageRequest, scan func(pgx.Row) (T, error), id func(T) string, q string, args ...any) (api.Page[T], error) {
	return page(ctx, tx, req, scan, id, q, args...)
}

// page runs a keyset-paginated list query: q must select rows ordered by id, with $1 the cursor
// (NULL for the first page) and $2 the limit plus one.
func page[T any](ctx context.Context, tx pgx.Tx, req api.PageRequest, scan func(pgx.Row) (T, error), id func(T) string, q string, args ...any) (api.Page[T], error) {
	after, err := decodeCursor(req.Cursor)
	if err != nil {
		return api.Page[T]{}, err
	}
	limit := req.PageLimit()
	rows, err := tx.Query(ctx, q, append([]any{after, limit + 1}, args...)...)
	if err != nil {
		return api.Page[T]{}, err
	}
	defer rows.Close()
	out := api.Page[T]{Items: []T{}}
	for rows.Next() {
		item, err := scan(rows)
		if err != nil {
			return api.Page[T]{}, err
		}
		out.Items = append(out.Items, item)
	}
	if err := rows.Err(); err != nil {
		return api.Page[T]{}, err
	}
	if len(out.Items) > limit {
		out.Items = out.Items[:limit]
		out.NextCursor = encodeCursor(id(out.Items[limit-1]))
	}
	return out, nil
}

// labelsOrEmpty stores nil labels as an empty object.
func labelsOrEmpty(l map[string]string) map[string]string {
	if l == nil {
		return map[string]string{}
	}
	return l
}

func conflictName(kind, name, tenant string) error {
	return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("a %s named %q already exists in tenant %s", kind, name, tenant),
		Details: map[string]any{"reason": "name_taken", "name": name}}
}
