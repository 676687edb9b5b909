package capacity

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
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

// reserveBatch places calls that share a batch key in one transaction of four round trips
// besides its begin and commit: the pool, one lock of the best-fit candidate nodes for all of
// them, those nodes' snapshots with the quotas, the plans made in Go, and one pipelined write. A call that does not fit the locked nodes, or
// would preempt, is sent back to be placed alone; an error of its own (quota) is its answer.
func reserveBatch(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	first := calls[0]
	pool, err := resolvePool(ctx, tx, first.Target.TenantPath, first.In.Pool)
	if err != nil {
		return failAll(calls, err), nil
	}
	return reserveBatchIn(ctx, tx, pool, calls)
}

// failAll answers err to every call.
func failAll(calls []*modules.BatchCall[api.CreateReservation], err error) []modules.BatchResult[api.Reservation] {
	out := make([]modules.BatchResult[api.Reservation], len(calls))
	for i := range out {
		out[i].Err = err
	}
	return out
}

// reserveBatchIn is reserveBatch once the pool is resolved.
func reserveBatchIn(ctx context.Context, tx pgx.Tx, pool poolRef, calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	out := make([]modules.BatchResult[api.Reservation], len(calls))
	first := calls[0]
	tenant := first.Target.TenantID
	now := pool.Now
	smallest := first.In.GPUs
	for _, c := range calls {
		smallest = min(smallest, c.In.GPUs)
	}
	cands, err := lockCandidates(ctx, tx, fitQuery(first.In.Model, false).skip,
		candidateArgs{Pool: pool.ID, Model: first.In.Model, GPUs: smallest, Limit: len(calls)})
	if err != nil {
		return nil, err
	}
	// The nodes' snapshots and the quotas in one round trip. The quotas are read, not locked:
	// the write's updates lock them last and check the limits again (see docs/capacity.md,
	// "Lock order"); over a limit there, the batch fails and its calls run alone.
	b := &pgx.Batch{}
	snaps := queueSnapshots(b, cands, window{start: now})
	var quotas quotaRows
	queueQuotas(b, tenant, pool.ID, &quotas)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("capacity: read the snapshots of %d nodes and the quotas: %w", len(cands), err)
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
// the call fits without preempting. It is incremental: a node's free count is kept and changes
// only when the node takes a placement, and a node with fewer free GPUs than a call asks for is
// passed over without planning.
type packer struct {
	now   time.Time
	nodes []packNode
}

type packNode struct {
	snap NodeSnapshot
	// windowed: some hold starts after now, so which holds a window overlaps depends on its
	// end, and the node's view is made per call. Otherwise every hold overlaps every window
	// that starts now, and the snapshot is the view.
	windowed bool
	free     int // freeWhole of the snapshot, when not windowed
}

func newPacker(snaps []NodeSnapshot, now time.Time) *packer {
	p := &packer{now: now, nodes: make([]packNode, len(snaps))}
	for i, s := range snaps {
		p.nodes[i].snap = s
		p.nodes[i].update(now)
	}
	return p
}

func (n *packNode) update(now time.Time) {
	n.windowed = false
	for _, h := range n.snap.Held {
		if h.From.After(now) || (h.To != nil && !h.To.After(now)) {
			n.windowed = true
		}
	}
	n.free = freeWhole(n.snap)
}

// packFit is a node that may fit a call, with its view over the call's window.
type packFit struct {
	node, free int
	view       *NodeSnapshot
}

// place chooses the node for shape over w, which starts now, and plans on it; ok is false when
// no node fits without preempting.
func (p *packer) place(shape api.Shape, w window) (node int, plan MemberPlan, ok bool) {
	fits := make([]packFit, 0, len(p.nodes))
	for j := range p.nodes {
		n := &p.nodes[j]
		view, free := &n.snap, n.free
		if n.windowed {
			v := during(n.snap, w.start, endOr(w.end))
			view, free = &v, freeWhole(v)
		}
		// free counts every whole GPU a normal booking may take: with fewer, Plan cannot fit.
		if free >= shape.GPUs {
			fits = append(fits, packFit{j, free, view})
		}
	}
	// Fewest free first, in node order among equals: the first that fits is the best fit.
	slices.SortStableFunc(fits, func(a, b packFit) int { return a.free - b.free })
	for _, f := range fits {
		if plan, ok := Plan(*f.view, shape, false); ok && len(plan.Preempts) == 0 {
			return f.node, plan, true
		}
	}
	return -1, MemberPlan{}, false
}

// take books picks on node j over w, for the calls planned after it.
func (p *packer) take(j int, picks []Pick, w window) {
	n := &p.nodes[j]
	for _, pk := range picks {
		n.snap.Held = append(n.snap.Held, Held{Resource: pk.Resource, Span: pk.Span, From: w.start, To: w.end})
	}
	n.update(p.now)
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
