package nodes

import (
	"context"
	"slices"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
)

// registerBatches registers the batch forms of the destructive lifecycle methods: each names
// several nodes of one pool, runs for all of them in one transaction or for none, and passes the
// tenant's destructive-batch quorum first (modules.Runtime.Quorum; docs/fleet.md).
func registerBatches(r *modules.Registry) {
	modules.Handle(r, api.NodesDrainMany, batchTarget(func(in api.DrainNodes) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.DrainNodes) (api.NodeBatch, error) {
			b := nodeBatch{method: api.NodesDrainMany.FullName(), pool: in.Pool, refs: in.Nodes, approval: in.Approval,
				params: map[string]any{"end": in.End}}
			return b.run(ctx, c, func(id string) (api.Node, error) { return drain(ctx, c, id, in.End) })
		})
	modules.Handle(r, api.NodesRetireMany, batchTarget(func(in api.RetireNodes) (string, string) { return in.TenantID, in.Pool }),
		func(ctx context.Context, c *modules.Call, in api.RetireNodes) (api.NodeBatch, error) {
			b := nodeBatch{method: api.NodesRetireMany.FullName(), pool: in.Pool, refs: in.Nodes, approval: in.Approval}
			return b.run(ctx, c, func(id string) (api.Node, error) { return retire(ctx, c, id) })
		})
}

// batchTarget is the pool a batch names, in the input's tenant or the caller's; the decision is
// on the tenant's nodes ("*"), as the batch's nodes are only resolved in its transaction.
func batchTarget[In any](ref func(In) (tenant, pool string)) modules.TargetFunc[In] {
	return func(ctx context.Context, l modules.Lookup, in In) (modules.Target, error) {
		tenant, pool := ref(in)
		t := modules.TenantTarget(l.Principal, tenant)
		t.Existing, t.Kind, t.Ref = true, "pool", pool
		_, err := fleet.PoolID(ctx, l.Q, t.TenantID, pool)
		return t, err
	}
}

// nodeBatch is one call of a batch method over nodes.
type nodeBatch struct {
	method, pool, approval string
	refs                   []string
	params                 map[string]any
}

// run resolves the batch's nodes, passes the quorum gate and then does one to each node, in id
// order (the lock order), answering them in the order named.
func (b nodeBatch) run(ctx context.Context, c *modules.Call, one func(id string) (api.Node, error)) (api.NodeBatch, error) {
	pool, err := fleet.PoolID(ctx, c.Tx, c.Target.TenantID, b.pool)
	if err != nil {
		return api.NodeBatch{}, err
	}
	ids := make([]string, len(b.refs))
	named := map[string]string{}
	for i, ref := range b.refs {
		if ids[i], err = fleet.NodeIDIn(ctx, c.Tx, pool, ref); err != nil {
			return api.NodeBatch{}, err
		}
		if other, dup := named[ids[i]]; dup {
			return api.NodeBatch{}, api.InvalidField("nodes", "%q and %q are the same node", other, ref)
		}
		named[ids[i]] = ref
	}
	var size int
	if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.nodes WHERE pool_id = $1 AND state <> 'retired'`, pool).Scan(&size); err != nil {
		return api.NodeBatch{}, err
	}
	spent, err := c.Runtime.Quorum.Check(ctx, c, modules.Batch{Method: b.method, Targets: ids, Params: b.params, Approval: b.approval,
		Groups: []modules.BatchGroup{{Kind: "pool", ID: pool, Size: size, Count: len(ids)}}})
	if err != nil {
		return api.NodeBatch{}, err
	}
	if err := fleet.LockNodes(ctx, c.Tx, ids); err != nil {
		return api.NodeBatch{}, err
	}
	done := map[string]api.Node{}
	for _, id := range slices.Sorted(slices.Values(ids)) {
		if done[id], err = one(id); err != nil {
			return api.NodeBatch{}, err
		}
	}
	out := api.NodeBatch{Nodes: make([]api.Node, len(ids)), Approval: spent}
	for i, id := range ids {
		out.Nodes[i] = done[id]
	}
	return out, nil
}
