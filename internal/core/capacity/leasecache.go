package capacity

import (
	"container/heap"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute/api"
)

// poolCache is what a lease holder remembers of its pool: for every node, whether it is
// schedulable, its GPUs, the whole-GPU holds from now on (read from the database, and those of its
// own writes), and which versions of the node's rollup row (node_capacity.changed) that state
// includes. It is a hint, never the truth: the holder's write checks the versions under the rows'
// locks (leaseLockSQL) and the exclusion constraint referees the atoms; a refusal reloads
// the nodes involved. Every method takes mu: planning from memory is a few microseconds.
type poolCache struct {
	mu    sync.Mutex
	pool  string
	epoch int64

	nodes    map[string]*leaseNode
	stale    map[*leaseNode]bool   // nodes out of placement until reloaded
	all      freeIndex             // every placeable node that is not windowed, for requests of any model
	models   map[string]*freeIndex // the same by the rollup's gpu_model
	windowed map[*leaseNode]bool   // placeable nodes whose view depends on the window
	edges    edgeHeap

	// since is where the next delta read starts: every rollup row written by a transaction the
	// last read could not see carries a changed at or above it.
	since uint64
	// now is the latest compute_now() seen: the clock of what memory does by itself.
	now time.Time
	// seq counts stale marks, so that a reload that began before a mark does not clear it.
	seq uint64
	// writes are this holder's transactions whose outcome is not known yet, with the nodes they
	// booked on: the worker asks the database whether each committed.
	writes map[uint64]map[*leaseNode]bool
}

// leaseNode is one node of a pool cache.
type leaseNode struct {
	snap        NodeSnapshot // GPUs, and the GPU holds that have not ended
	tags        []uint64     // per hold of snap.Held: the transaction of ours that wrote it; 0: read from the database
	model       string       // the rollup's gpu_model
	schedulable bool
	// known are the rollup versions whose effects the state includes: the one read last, and
	// those of our own writes since (a transaction id each; the newest last, a few kept).
	known []uint64
	// superseded are versions a write of ours that returned (by) has taken out of known: once it
	// commits, the row can no longer be at them, and if it rolled back they come back. A delta
	// that still shows one of them read the row before the commit, and is passed over.
	superseded []superseded
	// stale is the seq of the mark that took the node out of placement until it is reloaded; 0:
	// current.
	stale uint64

	// busy is the transaction of ours whose write to the node is on its way; other batches pass
	// the node over until it returns, as the database path skips a locked node, so that one of
	// ours never overtakes another on a node (and is refused for a version it could not know).
	busy uint64

	windowed bool      // a hold starts later than now: which holds a window overlaps depends on its end
	free     int       // freeWhole(snap), when not windowed
	edge     time.Time // the next instant a hold starts or ends; zero: none
	placed   struct {  // where the indexes have it
		in   bool
		free int
		win  bool
	}
}

// maxKnown bounds the versions a node remembers.
const maxKnown = 16

func newPoolCache(pool string, epoch int64) *poolCache {
	return &poolCache{pool: pool, epoch: epoch, nodes: map[string]*leaseNode{}, stale: map[*leaseNode]bool{}, models: map[string]*freeIndex{},
		windowed: map[*leaseNode]bool{}, writes: map[uint64]map[*leaseNode]bool{}}
}

// freeIndex orders placeable nodes for best fit: by free whole GPUs, then by node id.
type freeIndex struct{ buckets [][]*leaseNode }

func (x *freeIndex) add(n *leaseNode, free int) {
	for len(x.buckets) <= free {
		x.buckets = append(x.buckets, nil)
	}
	b := x.buckets[free]
	i := sort.Search(len(b), func(i int) bool { return b[i].snap.NodeID >= n.snap.NodeID })
	x.buckets[free] = slices.Insert(b, i, n)
}

func (x *freeIndex) remove(n *leaseNode, free int) {
	b := x.buckets[free]
	i := sort.Search(len(b), func(i int) bool { return b[i].snap.NodeID >= n.snap.NodeID })
	if i < len(b) && b[i] == n {
		x.buckets[free] = slices.Delete(b, i, i+1)
	}
}

// edgeHeap is the nodes' next edges, soonest first. An entry whose node has moved its edge since
// is skipped when it comes up.
type edgeHeap []edgeEntry

type edgeEntry struct {
	at   time.Time
	node *leaseNode
}

func (h edgeHeap) Len() int           { return len(h) }
func (h edgeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h edgeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *edgeHeap) Push(x any)        { *h = append(*h, x.(edgeEntry)) }
func (h *edgeHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// recount brings n up to now: holds that have ended go, and its place in the indexes follows its
// free GPUs, whether it is windowed, schedulable and current.
func (c *poolCache) recount(n *leaseNode, now time.Time) {
	held, tags := n.snap.Held[:0], n.tags[:0]
	var edge time.Time
	n.windowed = false
	for i, h := range n.snap.Held {
		if h.To != nil && !h.To.After(now) {
			continue // ended: no window from now on overlaps it
		}
		held, tags = append(held, h), append(tags, n.tags[i])
		if h.From.After(now) {
			n.windowed = true
			edge = earliest(edge, h.From)
		}
		if h.To != nil {
			edge = earliest(edge, *h.To)
		}
	}
	clear(n.snap.Held[len(held):])
	n.snap.Held, n.tags = held, tags
	n.free = freeWhole(n.snap)
	if !edge.IsZero() && !edge.Equal(n.edge) {
		heap.Push(&c.edges, edgeEntry{edge, n})
	}
	n.edge = edge
	c.reindex(n)
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// reindex moves n to where its state says it belongs in the indexes.
func (c *poolCache) reindex(n *leaseNode) {
	if p := n.placed; p.in {
		if p.win {
			delete(c.windowed, n)
		} else {
			c.all.remove(n, p.free)
			if x := c.models[n.model]; x != nil {
				x.remove(n, p.free)
			}
		}
		n.placed.in = false
	}
	if !n.schedulable || n.stale != 0 {
		return
	}
	n.placed.in, n.placed.win, n.placed.free = true, n.windowed, n.free
	if n.windowed {
		c.windowed[n] = true
		return
	}
	c.all.add(n, n.free)
	x := c.models[n.model]
	if x == nil {
		x = &freeIndex{}
		c.models[n.model] = x
	}
	x.add(n, n.free)
}

// advance applies the edges time has passed: holds that started or ended by now.
func (c *poolCache) advance(now time.Time) {
	if now.After(c.now) {
		c.now = now
	}
	for len(c.edges) > 0 && !c.edges[0].at.After(now) {
		e := heap.Pop(&c.edges).(edgeEntry)
		if e.node.edge.Equal(e.at) && c.nodes[e.node.snap.NodeID] == e.node {
			e.node.edge = time.Time{}
			c.recount(e.node, now)
		}
	}
}

// place chooses a node for shape over w, which starts now, as the batch packer would over a
// snapshot of every node of the pool: best fit (the fewest free whole GPUs that still fit, then
// node order), without preempting. Mixed-model nodes serve only requests of any model, as the
// candidate query has it.
func (c *poolCache) place(shape api.Shape, w window, xid uint64) (*leaseNode, MemberPlan, bool) {
	c.advance(w.start)
	idx := &c.all
	if shape.Model != "" {
		idx = c.models[shape.Model]
	}
	type fit struct {
		node *leaseNode
		free int
		view NodeSnapshot
	}
	var wins []fit
	for n := range c.windowed {
		if (shape.Model != "" && n.model != shape.Model) || (n.busy != 0 && n.busy != xid) {
			continue
		}
		v := during(n.snap, w.start, endOr(w.end))
		if f := freeWhole(v); f >= shape.GPUs {
			wins = append(wins, fit{n, f, v})
		}
	}
	slices.SortFunc(wins, func(a, b fit) int {
		if a.free != b.free {
			return a.free - b.free
		}
		return strings.Compare(a.node.snap.NodeID, b.node.snap.NodeID)
	})
	try := func(n *leaseNode, view NodeSnapshot) (MemberPlan, bool) {
		plan, ok := Plan(view, shape, false)
		return plan, ok && len(plan.Preempts) == 0
	}
	wi := 0
	if idx != nil {
		for k := shape.GPUs; k < len(idx.buckets); k++ {
			for _, n := range idx.buckets[k] {
				for ; wi < len(wins) && (wins[wi].free < k || wins[wi].free == k && wins[wi].node.snap.NodeID < n.snap.NodeID); wi++ {
					if plan, ok := try(wins[wi].node, wins[wi].view); ok {
						return wins[wi].node, plan, true
					}
				}
				if n.busy != 0 && n.busy != xid {
					continue
				}
				if plan, ok := try(n, n.snap); ok {
					return n, plan, true
				}
			}
		}
	}
	for ; wi < len(wins); wi++ {
		if plan, ok := try(wins[wi].node, wins[wi].view); ok {
			return wins[wi].node, plan, true
		}
	}
	return nil, MemberPlan{}, false
}

// take books picks on n over w in memory, as transaction xid's (not yet committed) write: later
// plans see them, and the node accepts xid's version of its rollup.
func (c *poolCache) take(n *leaseNode, picks []Pick, w window, xid uint64) {
	for _, p := range picks {
		n.snap.Held = append(n.snap.Held, Held{Resource: p.Resource, Span: p.Span, From: w.start, To: w.end})
		n.tags = append(n.tags, xid)
	}
	n.known = appendKnown(n.known, xid)
	n.busy = xid
	if c.writes[xid] == nil {
		c.writes[xid] = map[*leaseNode]bool{}
	}
	c.writes[xid][n] = true
	c.recount(n, w.start)
}

func appendKnown(known []uint64, v uint64) []uint64 {
	if slices.Contains(known, v) {
		return known
	}
	if len(known) >= maxKnown {
		known = slices.Delete(known, 0, 1)
	}
	return append(known, v)
}

// superseded is what one write of ours took out of a node's versions.
type superseded struct {
	by       uint64
	versions []uint64
}

// sent records that transaction xid's write returned: its nodes are free for other batches, and
// their rows will be at xid's version once it commits, so the versions before it are no longer
// accepted: a batch planned from here on that finds the row still at one of them (xid rolled
// back, its bookings still in memory) is refused and reads the node again.
func (c *poolCache) sent(xid uint64) {
	for n := range c.writes[xid] {
		if n.busy == xid {
			n.busy = 0
		}
		var keep, gone []uint64
		for _, k := range n.known {
			if k == xid || c.writes[k][n] {
				keep = append(keep, k)
			} else {
				gone = append(gone, k)
			}
		}
		if len(gone) > 0 {
			n.known = keep
			n.superseded = append(n.superseded, superseded{xid, gone})
		}
	}
}

// unsupersede forgets what xid took out of n's versions, and puts it back (restore) when xid
// rolled back.
func (n *leaseNode) unsupersede(xid uint64, restore bool) {
	n.superseded = slices.DeleteFunc(n.superseded, func(s superseded) bool {
		if s.by != xid {
			return false
		}
		if restore {
			for _, v := range s.versions {
				n.known = appendKnown(n.known, v)
			}
		}
		return true
	})
}

// isSuperseded reports whether v is a version a write of ours still on its way took out of n's.
func (n *leaseNode) isSuperseded(v uint64) bool {
	for _, s := range n.superseded {
		if slices.Contains(s.versions, v) {
			return true
		}
	}
	return false
}

// drop forgets what transaction xid booked in memory: its write was refused, or it rolled back.
func (c *poolCache) drop(xid uint64, now time.Time) {
	for n := range c.writes[xid] {
		if n.busy == xid {
			n.busy = 0
		}
		c.untag(n, xid, true)
		n.known = slices.DeleteFunc(n.known, func(k uint64) bool { return k == xid })
		n.unsupersede(xid, true)
		c.recount(n, now)
	}
	delete(c.writes, xid)
}

// committed records that transaction xid committed: its holds are the database's now.
func (c *poolCache) committed(xid uint64) {
	for n := range c.writes[xid] {
		c.untag(n, xid, false)
		n.unsupersede(xid, false)
	}
	delete(c.writes, xid)
}

// untag removes n's holds of xid (remove) or marks them as read from the database.
func (c *poolCache) untag(n *leaseNode, xid uint64, remove bool) {
	held, tags := n.snap.Held[:0], n.tags[:0]
	for i, h := range n.snap.Held {
		switch {
		case n.tags[i] != xid:
			held, tags = append(held, h), append(tags, n.tags[i])
		case !remove:
			held, tags = append(held, h), append(tags, 0)
		}
	}
	clear(n.snap.Held[len(held):])
	n.snap.Held, n.tags = held, tags
}

// pending lists our transactions whose outcome is not known yet.
func (c *poolCache) pending() []uint64 {
	out := make([]uint64, 0, len(c.writes))
	for x := range c.writes {
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

// markStale takes n out of placement until a reload that begins after now brings it back.
func (c *poolCache) markStale(n *leaseNode) {
	c.seq++
	n.stale = c.seq
	c.stale[n] = true
	c.reindex(n)
}

// applyDelta learns of rollup rows written since the last read: a node whose row was written by
// a transaction it does not know (another writer's) is marked stale, and a node it has never seen
// is added, stale. xmin is the oldest transaction running when the rows were read.
func (c *poolCache) applyDelta(xmin uint64, nodes []string, changed []uint64) {
	c.since = max(c.since, xmin)
	for i, id := range nodes {
		n := c.nodes[id]
		if n == nil {
			n = &leaseNode{snap: NodeSnapshot{NodeID: id}}
			c.nodes[id] = n
			c.markStale(n)
			continue
		}
		if !slices.Contains(n.known, changed[i]) {
			if !n.isSuperseded(changed[i]) {
				c.markStale(n)
			}
			continue
		}
		// The row is at a version memory includes: from now on it can only move to a later one,
		// which is another writer's or one of our writes still on their way.
		n.known = slices.DeleteFunc(n.known, func(k uint64) bool { return k != changed[i] && !c.writes[k][n] })
	}
}

// staleNodes lists the nodes waiting for a reload, in id order.
func (c *poolCache) staleNodes() []string {
	var out []string
	for n := range c.stale {
		out = append(out, n.snap.NodeID)
	}
	slices.Sort(out)
	return out
}

// loadedNode is a node as a load read it.
type loadedNode struct {
	id, name, model string
	schedulable     bool
	changed         uint64
	gpus            []GPUState
	held            []Held
}

// loaded is what one load or reload read, in one statement (one snapshot).
type loaded struct {
	xmin    uint64          // the oldest transaction running then
	now     time.Time       // compute_now()
	visible map[uint64]bool // which of our pending transactions it saw committed
	aborted map[uint64]bool // which of them had rolled back
	nodes   []loadedNode
}

// install replaces the state of the nodes asked for (ids; nil: the whole pool) with what a load
// read. Holds of our own transactions that the load did not see are kept (they may still commit);
// a node the load did not find (deleted, or moved to another pool) is forgotten. seq is c.seq when
// the load began: a node marked stale after that stays stale.
func (c *poolCache) install(l loaded, ids []string, seq uint64) {
	if l.now.After(c.now) {
		c.now = l.now
	}
	for x := range l.aborted {
		c.drop(x, c.now)
	}
	found := make(map[string]bool, len(l.nodes))
	for _, ln := range l.nodes {
		found[ln.id] = true
		n := c.nodes[ln.id]
		if n == nil {
			n = &leaseNode{}
			c.nodes[ln.id] = n
		}
		if n.placed.in && n.model != ln.model {
			n.schedulable = false
			c.reindex(n) // out of the old model's index before the model changes
		}
		held := append([]Held(nil), ln.held...)
		tags := make([]uint64, len(held))
		for i, h := range n.snap.Held {
			if x := n.tags[i]; x != 0 && !l.visible[x] && c.writes[x] != nil {
				held, tags = append(held, h), append(tags, x)
			}
		}
		// The versions the state now includes: the one read, and those of our writes it could
		// not see, which may still commit. Not the versions known before: loads may be installed
		// out of order, and an older one's state must not claim a newer version.
		known := []uint64{ln.changed}
		for _, x := range n.known {
			if c.writes[x][n] && !l.visible[x] && x != ln.changed {
				known = append(known, x)
			}
		}
		n.snap = NodeSnapshot{NodeID: ln.id, Name: ln.name, GPUs: ln.gpus, Held: held}
		n.tags, n.model, n.schedulable, n.known, n.superseded = tags, ln.model, ln.schedulable, known, nil
		if n.stale != 0 && n.stale <= seq {
			n.stale = 0
			delete(c.stale, n)
		}
		c.recount(n, l.now)
	}
	forget := func(id string, n *leaseNode) {
		n.schedulable = false
		c.reindex(n)
		delete(c.nodes, id)
		delete(c.stale, n)
		for _, w := range c.writes {
			delete(w, n)
		}
	}
	if ids == nil {
		for id, n := range c.nodes {
			if !found[id] && n.stale <= seq {
				forget(id, n)
			}
		}
		c.since = max(c.since, l.xmin)
		return
	}
	for _, id := range ids {
		if n := c.nodes[id]; n != nil && !found[id] && n.stale <= seq {
			forget(id, n)
		}
	}
}

// knownOf lists, for the write's nodes, the rollup versions their memory includes: the pairs
// leaseLockSQL accepts.
func knownOf(nodes []*leaseNode) (ids []string, known []uint64) {
	for _, n := range nodes {
		for _, k := range n.known {
			ids, known = append(ids, n.snap.NodeID), append(known, k)
		}
	}
	return ids, known
}
