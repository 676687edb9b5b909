package nodes

import (
	"context"
	"fmt"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/modules"
)

// transition moves the call's node between lifecycle states: allowed lists the states it may
// come from.
func transition(ctx context.Context, c *modules.Call, to string, allowed ...string) (api.Node, error) {
	return transitionOf(ctx, c, c.Target.ResourceID, to, allowed...)
}

// transitionOf is transition of node id, a node of the call's tenant.
func transitionOf(ctx context.Context, c *modules.Call, id, to string, allowed ...string) (api.Node, error) {
	n, err := lockNodeOf(ctx, c, id)
	if err != nil {
		return n, err
	}
	if n.State == to {
		return n, nil
	}
	ok := false
	for _, a := range allowed {
		ok = ok || n.State == a
	}
	if !ok {
		return n, &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("node %s is %s and cannot become %s", n.Name, n.State, to),
			Details: map[string]any{"reason": "state", "state": n.State}}
	}
	// Whether the node takes bookings is part of its rollup, which the write's trigger recounts.
	if err := fleet.SetState(ctx, c.Tx, []string{n.ID}, to); err != nil {
		return n, err
	}
	if err := events.Emit(ctx, c.Tx, "node."+to, n.TenantID, n.ID, map[string]any{"from": n.State}); err != nil {
		return n, err
	}
	return fleet.GetNode(ctx, c.Tx, n.ID, n.TenantID)
}

func lockNode(ctx context.Context, c *modules.Call) (api.Node, error) {
	return lockNodeOf(ctx, c, c.Target.ResourceID)
}

func lockNodeOf(ctx context.Context, c *modules.Call, id string) (api.Node, error) {
	if err := fleet.LockNodes(ctx, c.Tx, []string{id}); err != nil {
		return api.Node{}, err
	}
	return fleet.GetNode(ctx, c.Tx, id, c.Target.TenantID)
}

func nodeTarget[In any](ref func(In) api.NodeRef) modules.TargetFunc[In] {
	return func(ctx context.Context, l modules.Lookup, in In) (modules.Target, error) {
		return fleet.NodeTarget(ctx, l, ref(in))
	}
}

func registerLifecycle(r *modules.Registry) {
	modules.Handle(r, api.NodesCordon, nodeTarget(func(in api.CordonNode) api.NodeRef { return in.NodeRef }),
		func(ctx context.Context, c *modules.Call, in api.CordonNode) (api.Node, error) {
			return transition(ctx, c, api.NodeCordoned, api.NodeActive)
		})
	modules.Handle(r, api.NodesUncordon, nodeTarget(func(in api.UncordonNode) api.NodeRef { return in.NodeRef }),
		func(ctx context.Context, c *modules.Call, in api.UncordonNode) (api.Node, error) {
			return transition(ctx, c, api.NodeActive, api.NodeCordoned, api.NodeDraining)
		})
	modules.Handle(r, api.NodesDrain, nodeTarget(func(in api.DrainNode) api.NodeRef { return in.NodeRef }),
		func(ctx context.Context, c *modules.Call, in api.DrainNode) (api.Node, error) {
			return drain(ctx, c, c.Target.ResourceID, in.End)
		})
	modules.Handle(r, api.NodesRetire, nodeTarget(func(in api.RetireNode) api.NodeRef { return in.NodeRef }),
		func(ctx context.Context, c *modules.Call, in api.RetireNode) (api.Node, error) {
			return retire(ctx, c, c.Target.ResourceID)
		})
	modules.Handle(r, api.NodesSetLabels, nodeTarget(func(in api.SetNodeLabels) api.NodeRef { return in.NodeRef }),
		func(ctx context.Context, c *modules.Call, in api.SetNodeLabels) (api.Node, error) {
			if err := fleet.SetLabels(ctx, c.Tx, c.Target.TenantID, []string{c.Target.ResourceID}, in.Labels); err != nil {
				return api.Node{}, err
			}
			return fleet.GetNode(ctx, c.Tx, c.Target.ResourceID, c.Target.TenantID)
		})
}

// drain moves node id to draining and, with end, ends what it holds now.
func drain(ctx context.Context, c *modules.Call, id string, end bool) (api.Node, error) {
	n, err := transitionOf(ctx, c, id, api.NodeDraining, api.NodeActive, api.NodeCordoned)
	if err != nil || !end {
		return n, err
	}
	if _, err := capacity.EndOnNode(ctx, c.Tx, n.ID); err != nil {
		return n, err
	}
	return n, nil
}

// retire retires node id, which must hold nothing, and revokes its certificates.
func retire(ctx context.Context, c *modules.Call, id string) (api.Node, error) {
	n, err := lockNodeOf(ctx, c, id)
	if err != nil {
		return n, err
	}
	held, err := capacity.HoldsOnNode(ctx, c.Tx, n.ID)
	if err != nil {
		return n, err
	}
	if held {
		return n, &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("node %s still holds bookings, now or later; drain it (end: true) first", n.Name),
			Details: map[string]any{"reason": "node_holds_bookings", "node": n.ID}}
	}
	if _, err := pki.RevokeNode(ctx, c.Tx, n.ID); err != nil {
		return n, err
	}
	return transitionOf(ctx, c, id, api.NodeRetired, api.NodeActive, api.NodeCordoned, api.NodeDraining)
}
