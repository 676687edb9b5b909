package capacity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// reserveBatch places a batch of calls (see batchKey) from memory when this process holds the
// pool's lease, and through the database (reserveBatch) otherwise. From memory the transaction is
// begin, one round trip of reads (the pool and the clock, the quotas, the rollup rows other
// writers changed), the plans in memory, one round trip of writes, commit; a round trip more
// when another writer changed nodes, to read them again first.
func (l *Leases) reserveBatch(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	first := calls[0]
	ref := refKey(first.Target.TenantPath, first.In.Pool)
	if c := l.cacheFor(ref); c != nil {
		return l.fromMemory(ctx, tx, c, ref, nil, calls)
	}
	pool, err := resolvePool(ctx, tx, first.Target.TenantPath, first.In.Pool)
	if err != nil {
		return failAll(calls, err), nil
	}
	l.want(ref, pool.ID)
	l.mu.Lock()
	c := l.validCache(pool.ID)
	l.mu.Unlock()
	if c != nil {
		return l.fromMemory(ctx, tx, c, ref, &pool, calls)
	}
	return reserveBatchIn(ctx, tx, pool, calls)
}

// fromMemory places calls from c. pool is the pool when it was resolved already.
func (l *Leases) fromMemory(ctx context.Context, tx pgx.Tx, c *poolCache, ref string, pool *poolRef,
	calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	first := calls[0]
	tenant := first.Target.TenantID
	c.mu.Lock()
	since := c.since
	c.mu.Unlock()

	// One round trip: the pool and the clock (unless known), the quotas (read, not locked: the
	// write's increments check them), and the rows other writers changed, which also assigns
	// this transaction the id that its write will stamp on the rollups.
	b := &pgx.Batch{}
	var resolved poolRef
	var poolErr error
	if pool == nil {
		queueResolvePool(b, first.Target.TenantPath, first.In.Pool, &resolved, &poolErr)
	}
	var quotas quotaRows
	queueQuotas(b, tenant, c.pool, &quotas)
	var d delta
	if l.noDelta.Load() {
		b.Queue(`SELECT pg_current_xact_id()::text`).QueryRow(func(row pgx.Row) error {
			var x string
			if err := row.Scan(&x); err != nil {
				return err
			}
			var err error
			d.xid, err = parseXid(x)
			return err
		})
	} else {
		queueDelta(b, c.pool, since, true, &d)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("capacity: read for a placement from memory: %w", err)
	}
	if pool == nil {
		if poolErr != nil {
			return failAll(calls, poolErr), nil
		}
		pool = &resolved
	}
	if pool.ID != c.pool { // the name now means another pool
		l.want(ref, pool.ID)
		return reserveBatchIn(ctx, tx, *pool, calls)
	}

	c.mu.Lock()
	if !l.noDelta.Load() {
		c.applyDelta(d.xmin, d.nodes, d.changed)
	}
	stale := c.staleNodes()
	c.mu.Unlock()
	if len(stale) > maxInlineReload {
		l.wake.fire()
		l.stats.fallbacks.Add(1)
		return reserveBatchIn(ctx, tx, *pool, calls)
	}
	if len(stale) > 0 {
		if err := l.load(ctx, tx, c, stale); err != nil {
			return nil, err
		}
	}
	for range leaseAttempts {
		out, write := c.planBatch(calls, *pool, slices.Clone(quotas), d.xid)
		done := func() {
			for _, r := range out {
				if r.Alone {
					l.stats.notInMemory.Add(1)
				}
			}
		}
		if len(write.placed) == 0 {
			done()
			return out, nil
		}
		err := sendLeaseWrite(ctx, tx, c.pool, write, quotas)
		if err == nil {
			c.mu.Lock()
			c.sent(d.xid)
			c.mu.Unlock()
			l.stats.batches.Add(1)
			l.stats.placed.Add(int64(len(write.placed)))
			done()
			return out, nil
		}
		c.mu.Lock()
		c.drop(d.xid, pool.Now)
		c.mu.Unlock()
		if !staleWrite(err) {
			return nil, err
		}
		// Memory was stale: go back to before the write, read the nodes again, plan again.
		l.stats.refusal(postgres.ErrorCode(err))
		refused := staleNodesOf(err, write.nodes)
		c.mu.Lock()
		for _, id := range refused {
			if n := c.nodes[id]; n != nil {
				c.markStale(n)
			}
		}
		stale, seq, mine := c.staleNodes(), c.seq, c.pending()
		c.mu.Unlock()
		var got loaded
		rb := &pgx.Batch{}
		rb.Queue(`ROLLBACK TO SAVEPOINT lease_write`)
		queueLoad(rb, c.pool, stale, mine, &got)
		if err := tx.SendBatch(ctx, rb).Close(); err != nil {
			return nil, fmt.Errorf("capacity: read the nodes a placement from memory got wrong: %w", err)
		}
		c.mu.Lock()
		c.install(got, stale, seq)
		c.mu.Unlock()
		l.stats.reloaded.Add(int64(len(stale)))
	}
	l.stats.fallbacks.Add(1)
	return reserveBatchIn(ctx, tx, *pool, calls)
}

// leaseWrite is a batch's write from memory: the placements, and for leaseLockSQL the nodes they
// book with the rollup versions each node's memory includes (pairs: knownNodes[i] knew known[i]).
type leaseWrite struct {
	*bookingWrite
	nodes, knownNodes []string
	known             []uint64
}

// planBatch plans calls from memory, one after another, as reserveBatchIn does over the nodes it
// locked: each call's window and quotas, the best fit in memory, its booking taken in memory for
// the calls after it (as transaction xid's). A call memory has no room for is sent to be placed
// alone, through the database, which confirms or finds room. quotas are counted up as calls are
// placed.
func (c *poolCache) planBatch(calls []*modules.BatchCall[api.CreateReservation], pool poolRef, quotas quotaRows, xid uint64) (
	[]modules.BatchResult[api.Reservation], leaseWrite) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]modules.BatchResult[api.Reservation], len(calls))
	tenant, now := calls[0].Target.TenantID, pool.Now
	lw := leaseWrite{bookingWrite: newBookingWrite(tenant, pool.ID, now)}
	var touched []*leaseNode
	for i, call := range calls {
		in := call.In
		w, err := requestWindow(now, nil, in.Duration, in.End)
		if err == nil {
			err = quotas.check(tenant, requested(in))
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		n, plan, ok := c.place(in.Shape, w, xid)
		if !ok {
			out[i].Alone = true
			continue
		}
		snap := NodeSnapshot{NodeID: n.snap.NodeID, Name: n.snap.Name, GPUs: n.snap.GPUs}
		p := newPlacement(fleet.NewID(), call.Principal.ID, in, w, now, []memberPlan{{snap, plan}})
		if err := quotas.check(tenant, p.claims); err != nil {
			out[i].Err = err
			continue
		}
		if !slices.Contains(touched, n) {
			touched = append(touched, n)
		}
		quotas.add(p.claims)
		c.take(n, plan.Picks, w, xid)
		lw.add(p)
		out[i].Out = p.reservation(tenant, pool.ID, now)
	}
	// The versions include xid's own, which take added: harmless, as no row can carry it before
	// this transaction writes it.
	lw.knownNodes, lw.known = knownOf(touched)
	for _, n := range touched {
		lw.nodes = append(lw.nodes, n.snap.NodeID)
		lw.counted = append(lw.counted, NodeSnapshot{NodeID: n.snap.NodeID, GPUs: n.snap.GPUs, Held: slices.Clone(n.snap.Held)})
	}
	return out, lw
}

// leaseLockSQL is the first statement of a lease holder's write: it locks the rollups of the
// nodes $2 the write books (in node order, as every placer does, before anything is inserted),
// then refuses the write (compute.lease_refuse: SQLSTATE BCL01, the nodes in the detail) when one
// of them is no longer what memory says: its rollup was written by a transaction memory does not
// know ($3[i] knew $4[i]), it left the pool $1, it was deleted, or it is not schedulable. The
// exclusion constraint still referees the atoms; this refuses what the constraint cannot see (a
// cordon, a GPU gone unhealthy or into MIG mode) and what memory missed. Locked rows are read as
// their latest versions, after the waits.
const leaseLockSQL = `
WITH locked AS MATERIALIZED (
  SELECT nc.node_id, nc.pool_id, nc.schedulable, nc.changed FROM compute.node_capacity nc
  WHERE nc.node_id = ANY($2::uuid[]) ORDER BY nc.node_id FOR UPDATE
)
SELECT compute.lease_refuse(string_agg(u.n::text, ',' ORDER BY u.n))
FROM unnest($2::uuid[]) u(n) LEFT JOIN locked l ON l.node_id = u.n
WHERE l.node_id IS NULL OR l.pool_id <> $1 OR NOT l.schedulable
  OR NOT EXISTS (SELECT 1 FROM unnest($3::uuid[], $4::text[]::xid8[]) k(n, x) WHERE k.n = u.n AND k.x = l.changed)
HAVING count(*) > 0`

// sendLeaseWrite writes w in one round trip: a savepoint (a refusal goes back to it, and the
// batch plans again), leaseLockSQL, then the booking writer's statements.
func sendLeaseWrite(ctx context.Context, tx pgx.Tx, pool string, w leaseWrite, quotas quotaRows) error {
	b := &pgx.Batch{}
	b.Queue(`SAVEPOINT lease_write`)
	b.Queue(leaseLockSQL, pool, w.nodes, w.knownNodes, xidTexts(w.known))
	w.queue(b, quotas)
	err := tx.SendBatch(ctx, b).Close()
	switch {
	case err == nil, isAPIError(err), staleWrite(err):
		return err
	}
	return fmt.Errorf("capacity: write %d placements from memory: %w", len(w.placed), err)
}

// staleNodesOf lists the nodes a stale write names (leaseLockSQL's detail), or all it booked.
func staleNodesOf(err error, nodes []string) []string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == leaseStale && pg.Detail != "" {
		return strings.Split(pg.Detail, ",")
	}
	return nodes
}
