package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const nodeColumns = `id::text, tenant_id, pool_id::text, name, role, state, status, health, labels, last_seen_at, created_at, updated_at`

func scanNode(row pgx.Row) (api.Node, error) {
	var n api.Node
	err := row.Scan(&n.ID, &n.TenantID, &n.PoolID, &n.Name, &n.Role, &n.State, &n.Status, &n.Health, &n.Labels, &n.LastSeenAt, &n.CreatedAt, &n.UpdatedAt)
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
		return page(ctx, c.Tx, in.PageRequest, scanNode, func(n api.Node) string { return n.ID },
			`SELECT `+nodeColumns+` FROM compute.nodes
			 WHERE tenant_id = $3 AND ($4::uuid IS NULL OR pool_id = $4) AND ($5 = '' OR state = $5) AND ($6 = '' OR role = $6)
			   AND ($1::uuid IS NULL OR id > $1)
			 ORDER BY id LIMIT $2`, c.Target.TenantID, poolID, in.State, in.Role)
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
	Role   string // api.RoleNode (the default) or api.RoleSite
	Labels map[string]string
	Facts  map[string]any
}

// InsertNode adds a node to a pool, in the pool's tenant. It is the one place nodes are created.
func InsertNode(ctx context.Context, q postgres.Querier, n NewNode) (api.Node, error) {
	if n.Facts == nil {
		n.Facts = map[string]any{}
	}
	role := cmp.Or(n.Role, api.RoleNode)
	node, err := scanNode(q.QueryRow(ctx, `INSERT INTO compute.nodes (id, tenant_id, pool_id, name, labels, facts, role)
		SELECT $1, p.tenant_id, p.id, $3, $4, $5, $6 FROM compute.pools p WHERE p.id = $2
		RETURNING `+nodeColumns, NewID(), n.PoolID, n.Name, labelsOrEmpty(n.Labels), n.Facts, role))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return node, api.NotFound("pool", n.PoolID)
	case postgres.ErrorCode(err) == postgres.UniqueViolation:
		return node, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool already has a node named %q", n.Name),
			Details: map[string]any{"reason": "name_taken", "name": n.Name}}
	}
	return node, err
}

// InsertNode and the writes below are the only writes of node rows. Each is one statement,
// however many nodes it names. One that names several nodes expects the caller to
// hold their rows' locks already (LockNodes), as the lock order in docs/capacity.md asks; an
// UPDATE would take them in whatever order its plan visits them. The rollups of nodes whose
// state, status, health or pool change are recounted by a trigger of capacity's
// (compute.refresh_node_capacity), in the same statement, after these rows' locks.

// LockNodes takes the rows of nodes, in id order, for a transaction that will change them.
// NO KEY UPDATE, as an UPDATE of them takes: a booking holds KEY SHARE on its node through the
// foreign key, and must not wait.
func LockNodes(ctx context.Context, q postgres.Querier, ids []string) error {
	_, err := q.Exec(ctx, `SELECT 1 FROM compute.nodes WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE`, ids)
	return err
}

// Seen is when a node was last heard from.
type Seen struct {
	Node string
	At   time.Time
}

// MarkSeen records when nodes were last heard from, as a gateway's heartbeat flush writes it.
func MarkSeen(ctx context.Context, q postgres.Querier, seen []Seen) error {
	ids, at := make([]string, len(seen)), make([]time.Time, len(seen))
	for i, s := range seen {
		ids[i], at[i] = s.Node, s.At
	}
	_, err := q.Exec(ctx, `UPDATE compute.nodes n SET last_seen_at = u.t FROM unnest($1::uuid[], $2::timestamptz[]) AS u(n, t) WHERE n.id = u.n`, ids, at)
	return err
}

// Connect puts nodes that opened a session online, seen now: healthy, unless their reports
// already said otherwise.
func Connect(ctx context.Context, q postgres.Querier, ids []string) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET status = 'online', last_seen_at = compute.compute_now(), updated_at = compute.compute_now(),
		  health = CASE WHEN health = 'unknown' THEN 'healthy' ELSE health END WHERE id = ANY($1::uuid[])`, ids)
	return err
}

// SetStatus moves the nodes among ids whose status differs to status, and returns those it
// moved. A retired node is never put online.
func SetStatus(ctx context.Context, q postgres.Querier, ids []string, status string) ([]api.Node, error) {
	rows, err := q.Query(ctx, `UPDATE compute.nodes SET status = $2, updated_at = compute.compute_now()
		WHERE id = ANY($1::uuid[]) AND status <> $2 AND ($2 <> $3 OR state <> $4)
		RETURNING `+nodeColumns, ids, status, api.NodeOnline, api.NodeRetired)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Node, error) { return scanNode(r) })
}

// SetHealth sets the health of the nodes among ids whose health differs.
func SetHealth(ctx context.Context, q postgres.Querier, ids []string, health string) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET health = $2, updated_at = compute.compute_now() WHERE id = ANY($1::uuid[]) AND health <> $2`, ids, health)
	return err
}

// SetState moves nodes to a lifecycle state. Which moves are allowed is the caller's decision,
// made under the rows' locks.
func SetState(ctx context.Context, q postgres.Querier, ids []string, state string) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET state = $2, updated_at = compute.compute_now() WHERE id = ANY($1::uuid[])`, ids, state)
	return err
}

// SetLabels replaces the labels of a tenant's nodes among ids.
func SetLabels(ctx context.Context, q postgres.Querier, tenant string, ids []string, labels map[string]string) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET labels = $3, updated_at = compute.compute_now() WHERE id = ANY($1::uuid[]) AND tenant_id = $2`,
		ids, tenant, labelsOrEmpty(labels))
	return err
}

// SetFacts replaces what nodes say about themselves, as a join that takes a node over does.
func SetFacts(ctx context.Context, q postgres.Querier, ids []string, facts map[string]any) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET facts = $2, updated_at = compute.compute_now() WHERE id = ANY($1::uuid[])`, ids, facts)
	return err
}

// MergeFacts adds facts to what nodes say about themselves, replacing those of the same keys, as
// an inventory report does.
func MergeFacts(ctx context.Context, q postgres.Querier, ids []string, facts map[string]any) error {
	_, err := q.Exec(ctx, `UPDATE compute.nodes SET facts = facts || $2::jsonb, updated_at = compute.compute_now() WHERE id = ANY($1::uuid[])`, ids, facts)
	return err
}
