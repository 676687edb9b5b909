package capacity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Leases is the pool-lease placer of one control plane (docs/capacity.md, "The pool lease"). A
// process that places for a pool takes the pool's lease (compute.pool_leases) when no one holds
// it, loads the pool's placement state into memory, and then places the pool's common requests
// (the batched shape) from memory: its transactions only write, with the rollups of the nodes
// they book locked and checked against what memory says (leaseLockSQL), and the exclusion
// constraint still the referee. Every other process places as before. Its worker renews the
// leases every TTL/5, keeps the memory current, and gives the leases up when it stops; a holder
// that dies loses its lease within the TTL, and the next process that places for the pool takes
// it. Nothing depends on the lease for correctness: two processes that both believe they hold it
// only meet refusals of the database.
type Leases struct {
	ttl, renew time.Duration
	holder     string
	log        *slog.Logger

	mu    sync.Mutex
	pools map[string]*leasedPool // by pool id: wanted, and perhaps held
	refs  map[string]string      // tenant path and pool name or id → pool id
	wake  signal

	// noDelta (tests: export_test.go) skips the delta reads: memory then learns of other
	// writers only from refused writes.
	noDelta atomic.Bool

	stats leaseCounters
}

// LeaseConfig configures the pool-lease placer.
type LeaseConfig struct {
	// TTL is how long a lease lasts without renewal, and so how long a pool waits for a new
	// holder after its holder died; it is renewed every TTL/5. Zero is LeaseTTLDefault; negative
	// turns the placer off (every placement is the database's).
	TTL time.Duration
	// Logger receives the leases taken, lost and given up.
	Logger *slog.Logger
}

// LeaseTTLDefault is the lease time when LeaseConfig.TTL is zero.
const LeaseTTLDefault = 5 * time.Second

const (
	// leaseIdle is how long a pool no placement asked for keeps its lease.
	leaseIdle = time.Minute
	// leaseFullReload is how often a holder reads its whole pool again: what the rollup rows do
	// not show (a booking that starts later, its cancellation) is learnt by then at the latest.
	leaseFullReload = time.Minute
	// maxInlineReload bounds the nodes a batch reloads itself before planning; with more stale,
	// it places through the database and the worker catches up.
	maxInlineReload = 64
	// leaseAttempts bounds the plans of a batch whose writes memory got wrong; then the batch is
	// placed through the database. Each refusal costs a round trip to go back and read the nodes
	// again; where memory was wrong twice, the pool is changing faster than memory follows (a
	// small, full pool under a storm of other writers), and the database path is the better bet.
	leaseAttempts = 2
)

// leasedPool is a pool a placement asked for.
type leasedPool struct {
	wanted     time.Time  // when a placement last asked
	cache      *poolCache // its memory, while held and loaded
	epoch      int64
	validUntil time.Time // when this process stops trusting its lease without a renewal
	loadedAt   time.Time
}

// NewLeases returns the pool-lease placer of a control plane. It starts nothing: its worker
// (Module registers it, in the api mode) does.
func NewLeases(cfg LeaseConfig) *Leases {
	if cfg.TTL == 0 {
		cfg.TTL = LeaseTTLDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &Leases{ttl: cfg.TTL, renew: cfg.TTL / 5, log: cfg.Logger,
		holder: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:])),
		pools:  map[string]*leasedPool{}, refs: map[string]string{}}
}

// On reports whether the placer places anything (nil, or a negative TTL, is off).
func (l *Leases) On() bool { return l != nil && l.ttl > 0 }

// Holder is how this process names itself in compute.pool_leases: host/pid/random.
func (l *Leases) Holder() string { return l.holder }

// LeaseStats counts what the placer did since it was made.
type LeaseStats struct {
	Taken, Lost     int64            // leases taken (or taken back), lost
	Loads           int64            // whole pools read into memory
	Batches         int64            // batches placed from memory
	Placed          int64            // calls placed from memory
	NotInMemory     int64            // calls memory had no room for, sent to the database path
	Refused         int64            // writes refused because memory was stale (then reloaded, planned again)
	Fallbacks       int64            // batches placed through the database after all (memory too stale, attempts spent)
	ReloadedNodes   int64            // nodes read again after another writer changed them
	ConflictsByCode map[string]int64 // the refused writes by SQLSTATE: BCL01 (the lease check), 23P01 (the exclusion constraint)
}

type leaseCounters struct {
	taken, lost, loads, batches, placed, notInMemory, refused, fallbacks, reloaded atomic.Int64
	mu                                                                             sync.Mutex
	codes                                                                          map[string]int64
}

func (c *leaseCounters) refusal(code string) {
	c.refused.Add(1)
	c.mu.Lock()
	if c.codes == nil {
		c.codes = map[string]int64{}
	}
	c.codes[code]++
	c.mu.Unlock()
}

// Stats returns the counts so far.
func (l *Leases) Stats() LeaseStats {
	s := &l.stats
	s.mu.Lock()
	codes := map[string]int64{}
	for k, v := range s.codes {
		codes[k] = v
	}
	s.mu.Unlock()
	return LeaseStats{Taken: s.taken.Load(), Lost: s.lost.Load(), Loads: s.loads.Load(), Batches: s.batches.Load(),
		Placed: s.placed.Load(), NotInMemory: s.notInMemory.Load(), Refused: s.refused.Load(), Fallbacks: s.fallbacks.Load(),
		ReloadedNodes: s.reloaded.Load(), ConflictsByCode: codes}
}

// Held reports whether this process holds pool's lease and has its memory loaded.
func (l *Leases) Held(pool string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[pool]
	return p != nil && p.cache != nil && time.Now().Before(p.validUntil)
}

// Await asks for pool's lease and waits until this process holds it with the pool in memory, or
// ctx ends. For tests and benchmarks; placements ask by themselves.
func (l *Leases) Await(ctx context.Context, pool string) error {
	if !l.On() {
		return errors.New("capacity: the pool-lease placer is off")
	}
	l.mu.Lock()
	p := l.pools[pool]
	if p == nil {
		p = &leasedPool{}
		l.pools[pool] = p
	}
	p.wanted = time.Now()
	l.mu.Unlock()
	l.wake.fire()
	for !l.Held(pool) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("capacity: waiting for the lease of pool %s: %w", pool, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// refKey names a pool as a call does: the tenant path it is looked up in, and its name or id.
func refKey(path []string, ref string) string { return strings.Join(path, "\x00") + "\x01" + ref }

// want records that a placement asked for pool (named ref), and wakes the worker when the pool is
// new to it.
func (l *Leases) want(ref, pool string) {
	now := time.Now()
	l.mu.Lock()
	l.refs[ref] = pool
	p := l.pools[pool]
	fresh := p == nil
	if fresh {
		p = &leasedPool{}
		l.pools[pool] = p
	}
	p.wanted = now
	l.mu.Unlock()
	if fresh {
		l.wake.fire()
	}
}

// cacheFor returns the memory of the pool ref names, when this process holds its lease.
func (l *Leases) cacheFor(ref string) *poolCache {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.refs[ref]
	if !ok {
		return nil
	}
	return l.validCache(id)
}

func (l *Leases) validCache(pool string) *poolCache {
	p := l.pools[pool]
	if p == nil || p.cache == nil || !time.Now().Before(p.validUntil) {
		return nil
	}
	p.wanted = time.Now()
	return p.cache
}

// run is the placer's worker: it takes, renews and gives up leases, and keeps the memory of the
// pools it holds current. It gives every lease up when ctx ends.
func (l *Leases) run(ctx context.Context, rt *modules.Runtime) error {
	defer func() {
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		l.giveUp(gctx, rt.DB, nil)
	}()
	return modules.EveryOrWoken(ctx, l.renew, l.wake.wait, func() error { return l.round(ctx, rt.DB) })
}

// takeSQL takes the leases of pools that are free or expired, and renews those this process
// holds, in one statement. A lease taken from another holder, or taken back after it expired,
// gets the next epoch.
const takeSQL = `
INSERT INTO compute.pool_leases AS l (pool_id, holder, epoch, taken_at, expires_at)
SELECT p, @holder, 1, now(), now() + @ttl::interval
FROM unnest(@pools::uuid[]) p WHERE EXISTS (SELECT 1 FROM compute.pools WHERE id = p)
ON CONFLICT (pool_id) DO UPDATE SET
  epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > now() THEN l.epoch ELSE l.epoch + 1 END,
  taken_at = CASE WHEN l.holder = excluded.holder AND l.expires_at > now() THEN l.taken_at ELSE now() END,
  holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= now()
RETURNING pool_id::text, epoch`

// round renews or takes the leases of the pools placements asked for lately, gives up the
// others, loads what it took and brings what it holds up to date.
func (l *Leases) round(ctx context.Context, db *postgres.DB) error {
	now := time.Now()
	var want, idle []string
	l.mu.Lock()
	for id, p := range l.pools {
		if now.Sub(p.wanted) > leaseIdle {
			idle = append(idle, id)
		} else {
			want = append(want, id)
		}
	}
	l.mu.Unlock()
	if len(idle) > 0 {
		l.giveUp(ctx, db, idle)
	}
	if len(want) == 0 {
		return nil
	}
	slices.Sort(want) // one order of lease rows for every process
	sent := time.Now()
	rows, err := db.Pool.Query(ctx, takeSQL, pgx.NamedArgs{"holder": l.holder, "ttl": fmt.Sprintf("%d milliseconds", l.ttl.Milliseconds()), "pools": want})
	if err != nil {
		return fmt.Errorf("capacity: take or renew pool leases: %w", err)
	}
	held := map[string]int64{}
	var id string
	var epoch int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &epoch}, func() error { held[id] = epoch; return nil }); err != nil {
		return fmt.Errorf("capacity: take or renew pool leases: %w", err)
	}
	var errs []error
	for _, id := range want {
		epoch, ok := held[id]
		l.mu.Lock()
		p := l.pools[id]
		if p == nil { // given up meanwhile
			l.mu.Unlock()
			continue
		}
		if !ok {
			if p.cache != nil {
				p.cache = nil
				l.stats.lost.Add(1)
				l.log.InfoContext(ctx, "capacity: pool lease lost", "pool", id, "epoch", p.epoch)
			}
			l.mu.Unlock()
			continue
		}
		if p.cache != nil && p.epoch == epoch {
			p.validUntil = sent.Add(l.ttl - l.renew)
			l.mu.Unlock()
			continue
		}
		l.mu.Unlock()
		c := newPoolCache(id, epoch)
		if err := l.load(ctx, db.Pool, c, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		l.mu.Lock()
		if p := l.pools[id]; p != nil {
			p.cache, p.epoch, p.validUntil, p.loadedAt = c, epoch, sent.Add(l.ttl-l.renew), time.Now()
		}
		l.mu.Unlock()
		l.stats.taken.Add(1)
		l.log.InfoContext(ctx, "capacity: pool lease taken", "pool", id, "epoch", epoch, "nodes", len(c.nodes))
	}
	for _, id := range want {
		l.mu.Lock()
		c := l.validCache(id)
		full := c != nil && time.Since(l.pools[id].loadedAt) > leaseFullReload
		if full {
			l.pools[id].loadedAt = time.Now()
		}
		l.mu.Unlock()
		if c != nil {
			if err := l.catchUp(ctx, db, c, full); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// batchSender is a pool or a transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// load reads nodes of c's pool (nil: all) into c, in q.
func (l *Leases) load(ctx context.Context, q batchSender, c *poolCache, nodes []string) error {
	c.mu.Lock()
	seq, mine := c.seq, c.pending()
	c.mu.Unlock()
	var got loaded
	b := &pgx.Batch{}
	queueLoad(b, c.pool, nodes, mine, &got)
	if err := q.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("capacity: load pool %s for its lease: %w", c.pool, err)
	}
	c.mu.Lock()
	c.install(got, nodes, seq)
	c.mu.Unlock()
	if nodes == nil {
		l.stats.loads.Add(1)
	} else {
		l.stats.reloaded.Add(int64(len(nodes)))
	}
	return nil
}

// catchUp brings c up to date while no placement asks: the rollup rows other writers changed,
// the outcome of our own transactions, and, when full, the whole pool again.
func (l *Leases) catchUp(ctx context.Context, db *postgres.DB, c *poolCache, full bool) error {
	c.mu.Lock()
	since, mine := c.since, c.pending()
	c.mu.Unlock()
	var d delta
	status := map[uint64]string{}
	b := &pgx.Batch{}
	queueDelta(b, c.pool, since, false, &d)
	if len(mine) > 0 {
		xactStatus(b, mine, status)
	}
	if err := db.Pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("capacity: catch up with pool %s: %w", c.pool, err)
	}
	c.mu.Lock()
	for x, s := range status {
		switch s {
		case "in progress":
		case "aborted":
			c.drop(x, c.now)
		default: // committed, or too old to tell: the database has its holds (or had)
			c.committed(x)
		}
	}
	if !l.noDelta.Load() {
		c.applyDelta(d.xmin, d.nodes, d.changed)
	}
	stale := c.staleNodes()
	full = full || len(stale) > max(maxInlineReload, len(c.nodes)/4)
	c.mu.Unlock()
	switch {
	case full:
		return l.load(ctx, db.Pool, c, nil)
	case len(stale) > 0:
		return l.load(ctx, db.Pool, c, stale)
	}
	return nil
}

// giveUp ends this process's leases of pools (nil: all it holds) and forgets them.
func (l *Leases) giveUp(ctx context.Context, db *postgres.DB, pools []string) {
	l.mu.Lock()
	if pools == nil {
		for id := range l.pools {
			pools = append(pools, id)
		}
	}
	for _, id := range pools {
		delete(l.pools, id)
	}
	for ref, id := range l.refs {
		if l.pools[id] == nil {
			delete(l.refs, ref)
		}
	}
	l.mu.Unlock()
	if len(pools) == 0 {
		return
	}
	tag, err := db.Pool.Exec(ctx, `UPDATE compute.pool_leases SET expires_at = now() WHERE pool_id = ANY($1::uuid[]) AND holder = $2 AND expires_at > now()`,
		pools, l.holder)
	if err != nil {
		l.log.WarnContext(ctx, "capacity: give up pool leases", "error", err)
		return
	}
	if tag.RowsAffected() > 0 {
		l.log.InfoContext(ctx, "capacity: pool leases given up", "pools", tag.RowsAffected())
	}
}

// signal wakes a worker that waits in modules.EveryOrWoken.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
