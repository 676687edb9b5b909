package capacity

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/modules"
)

// batchKey says which reservations.create calls may share a transaction: the common shape (whole
// GPUs of one model, now, one member, no labels, vCPUs or spot) of one tenant in one pool. Any
// other request is placed alone.
func batchKey(t modules.Target, in api.CreateReservation) string {
	if in.GPUs == 0 || in.Start != nil || in.MemberCount() != 1 || in.Spot || in.VCPUs != 0 || in.MemoryGiB != 0 ||
		len(in.RequireLabels) != 0 || len(in.AvoidLabels) != 0 {
		return ""
	}
	return t.TenantID + "\x00" + in.Pool + "\x00" + in.Model
}

// reserveBatch places calls that share a batch key in one transaction: one pool lookup, one
// quota lock, one lock of the best-fit candidate nodes for all of them, the plans made in Go over
// those nodes' snapshots, and one pipelined write. A call that does not fit the locked nodes, or
// would preempt, is sent back to be placed alone; an error of its own (quota) is its answer.
func reserveBatch(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	out := make([]modules.BatchResult[api.Reservation], len(calls))
	first := calls[0]
	tenant := first.Target.TenantID
	pool, err := resolvePool(ctx, tx, first.Target.TenantPath, first.In.Pool)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out, nil
	}
	now := pool.Now
	smallest := first.In.GPUs
	for _, c := range calls {
		smallest = min(smallest, c.In.GPUs)
	}
	cands, err := lockCandidates(ctx, tx, fitQuery(first.In.Model).skip,
		candidateArgs{Pool: pool.ID, Model: first.In.Model, GPUs: smallest, Limit: len(calls)})
	if err != nil {
		return nil, err
	}
	snaps, err := loadSnapshots(ctx, tx, cands, window{start: now})
	if err != nil {
		return nil, err
	}
	// Quotas after the nodes (see docs/capacity.md, "Lock order").
	quotas, err := lockQuotas(ctx, tx, tenant, pool.ID)
	if err != nil {
		return nil, err
	}

	pk := newPacker(snaps, now)
	write := newBookingWrite(tenant, pool.ID, now)
	for i, c := range calls {
		in := c.In
		w, err := requestWindow(now, nil, in.Duration, in.End)
		if err == nil {
			err = quotas.check(tenant, requested(in))
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		j, plan, ok := pk.place(in.Shape, w)
		if !ok {
			out[i].Alone = true
			continue
		}
		p := newPlacement(fleet.NewID(), c.Principal.ID, in, w, now, []memberPlan{{pk.nodes[j].snap, plan}})
		if err := quotas.check(tenant, p.claims); err != nil {
			out[i].Err = err
			continue
		}
		quotas.add(p.claims)
		pk.take(j, plan.Picks, w)
		write.add(p)
		out[i].Out = p.reservation(tenant, pool.ID, now)
	}
	if err := write.send(ctx, tx, quotas); err != nil {
		return nil, err
	}
	return out, nil
}

// packer plans a batch's calls one after another over the snapshots of the nodes the batch
// locked (every booking from now on): best fit, the node with the fewest free whole GPUs on which
// the call fits without preempting.
type packer struct {
	now   time.Time
	nodes []packNode
}

type packNode struct {
	snap NodeSnapshot
}

func newPacker(snaps []NodeSnapshot, now time.Time) *packer {
	p := &packer{now: now, nodes: make([]packNode, len(snaps))}
	for i, s := range snaps {
		p.nodes[i] = packNode{snap: s}
	}
	return p
}

// place chooses the node for shape over w, which starts now, and plans on it; ok is false when
// no node fits without preempting.
func (p *packer) place(shape api.Shape, w window) (node int, plan MemberPlan, ok bool) {
	best, bestFree := -1, 0
	for j := range p.nodes {
		view := during(p.nodes[j].snap, w.start, endOr(w.end))
		pl, ok := Plan(view, shape, false)
		if !ok || len(pl.Preempts) > 0 {
			continue
		}
		if free := freeWhole(view); best < 0 || free < bestFree {
			best, bestFree, plan = j, free, pl
		}
	}
	return best, plan, best >= 0
}

// take books picks on node j over w, for the calls planned after it.
func (p *packer) take(j int, picks []Pick, w window) {
	n := &p.nodes[j]
	for _, pk := range picks {
		n.snap.Held = append(n.snap.Held, Held{Resource: pk.Resource, Span: pk.Span, From: w.start, To: w.end})
	}
}

// freeWhole counts the whole-mode GPUs of a snapshot with nothing held on them.
func freeWhole(n NodeSnapshot) int {
	free := 0
	for _, g := range n.GPUs {
		if g.Mode == api.GPUModeWhole && g.Healthy && !hardHeld(n.Held, "gpu", GPUSpan(g.Index)) {
			free++
		}
	}
	return free
}

// endOr is the end of a window for overlap tests: far in the future when there is none.
func endOr(t *time.Time) time.Time {
	if t == nil {
		return farFuture
	}
	return *t
}
