package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const nodeColumns = `id::text, tenant_id, pool_id::text, name, state, status, health, labels, last_seen_at, created_at, updated_at`

func scanNode(row pgx.Row) (api.Node, error) {
	var n api.Node
	err := row.Scan(&n.ID, &n.TenantID, &n.PoolID, &n.Name, &n.State, &n.Status, &n.Health, &n.Labels, &n.LastSeenAt, &n.CreatedAt, &n.UpdatedAt)
	return n, err
}

func registerNodes(r *modules.Registry) {
	modules.Handle(r, api.NodesGet,
		func(ctx context.Context, l modules.Lookup, in api.GetNode) (modules.Target, error) {
			return NodeTarget(ctx, l, api.NodeRef(in))
		},
		func(ctx context.Context, c *modules.Call, in api.GetNode) (api.Node, error) {
			n, err := scanNode(c.Tx.QueryRow(ctx, `SELECT `+nodeColumns+` FROM compute.nodes WHERE id = $1 AND tenant_id = $2`,
				c.Target.ResourceID, c.Target.TenantID))
			if errors.Is(err, pgx.ErrNoRows) {
				return n, api.NotFound("node", c.Target.Ref)
			}
			return n, err
		})

	modules.Handle(r, api.NodesList, nil, func(ctx context.Context, c *modules.Call, in api.ListNodes) (api.Page[api.Node], error) {
		var poolID *string
		if in.Pool != "" {
			id, err := poolRef.idIn(ctx, c.Tx, c.Target.TenantID, in.Pool)
			if err != nil {
				return api.Page[api.Node]{}, err
			}
			poolID = &id
		}
		var state *string
		if in.State != "" {
			state = &in.State
		}
		return page(ctx, c.Tx, in.PageRequest, scanNode, func(n api.Node) string { return n.ID },
			`SELECT `+nodeColumns+` FROM compute.nodes
			 WHERE tenant_id = $3 AND ($4::uuid IS NULL OR pool_id = $4) AND ($5::text IS NULL OR state = $5)
			   AND ($1::uuid IS NULL OR id > $1)
			 ORDER BY id LIMIT $2`, c.Target.TenantID, poolID, state)
	})
}

// NodeTarget resolves a node named by id, or by name within a pool (of the input's tenant, or
// the caller's).
func NodeTarget(ctx context.Context, l modules.Lookup, ref api.NodeRef) (modules.Target, error) {
	if ref.Pool == "" || IsID(ref.Node) {
		if !IsID(ref.Node) {
			return modules.Target{}, api.InvalidField("pool", "is required to find node %q by name", ref.Node)
		}
		return nodeRef.resolve(ctx, l.Q, "", ref.Node)
	}
	pool, err := poolRef.inTenant(ctx, l.Q, l.Principal, ref.TenantID, ref.Pool)
	if err != nil {
		return pool, err
	}
	t, err := nodeRef.resolve(ctx, l.Q, pool.ResourceID, ref.Node)
	t.Ref = ref.Pool + "/" + ref.Node
	return t, err
}

// GetNode reads a node of a tenant.
func GetNode(ctx context.Context, q postgres.Querier, id, tenant string) (api.Node, error) {
	n, err := scanNode(q.QueryRow(ctx, `SELECT `+nodeColumns+` FROM compute.nodes WHERE id = $1 AND tenant_id = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return n, api.NotFound("node", id)
	}
	return n, err
}

// NewNode is a node as a join creates it.
type NewNode struct {
	PoolID string
	Name   string
	Labels map[string]string
	Facts  map[string]any
}

// InsertNode adds a node to a pool, in the pool's tenant. It is the one place nodes are created.
func InsertNode(ctx context.Context, q postgres.Querier, n NewNode) (api.Node, error) {
	if n.Facts == nil {
		n.Facts = map[string]any{}
	}
	node, err := scanNode(q.QueryRow(ctx, `INSERT INTO compute.nodes (id, tenant_id, pool_id, name, labels, facts)
		SELECT $1, p.tenant_id, p.id, $3, $4, $5 FROM compute.pools p WHERE p.id = $2
		RETURNING `+nodeColumns, NewID(), n.PoolID, n.Name, labelsOrEmpty(n.Labels), n.Facts))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return node, api.NotFound("pool", n.PoolID)
	case postgres.ErrorCode(err) == postgres.UniqueViolation:
		return node, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool already has a node named %q", n.Name),
			Details: map[string]any{"reason": "name_taken", "name": n.Name}}
	}
	return node, err
}
