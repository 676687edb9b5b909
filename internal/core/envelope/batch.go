package envelope

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

// MaxBatch bounds how many calls share one transaction.
const MaxBatch = 64

// BatchesInFlight is how many batches of one key may run at once.
var BatchesInFlight = 2

// Group commit without a goroutine of its own: the first call to arrive when fewer than
// BatchesInFlight batches of its key are running becomes a leader and runs, one transaction at a
// time, every call that queued meanwhile (its own first); the others wait for their results. With
// one caller a batch is one call; under load batches grow by themselves, and two of a key run at
// once, so that one is planned and written while the other waits on the database (they lock
// different nodes: the candidates are taken with SKIP LOCKED).

type batchers struct {
	mu sync.Mutex
	m  map[string]*batcher
}

type batcher struct {
	mu      sync.Mutex
	pending []*pending
	running int // leaders
}

type pending struct {
	ctx  context.Context
	p    iam.Principal
	t    modules.Target
	key  string
	hash []byte
	in   any
	done chan outcome
}

type outcome struct {
	res Result
	err error
}

func (e *Envelope) batched(ctx context.Context, h *modules.Handler, bkey string, c *pending) (Result, error) {
	name := h.Info.FullName() + "\x00" + bkey
	e.batch.mu.Lock()
	if e.batch.m == nil {
		e.batch.m = map[string]*batcher{}
	}
	b := e.batch.m[name]
	if b == nil {
		b = &batcher{}
		e.batch.m[name] = b
	}
	e.batch.mu.Unlock()

	c.done = make(chan outcome, 1)
	b.mu.Lock()
	b.pending = append(b.pending, c)
	lead := b.running < BatchesInFlight
	if lead {
		b.running++
	}
	b.mu.Unlock()
	if lead {
		e.lead(h, b, name, c)
	}
	select {
	case o := <-c.done:
		return o.res, o.err
	case <-ctx.Done():
		// The batch goes on; this caller stops waiting. What it wrote, if anything, stands.
		return Result{}, e.mapError(ctx, h, ctx.Err())
	}
}

// lead runs b's pending calls, batch after batch, until none is left or the batch with the
// leader's own call (mine) has run: then a new goroutine takes over the lead (and ends at once
// if nothing is pending), so that the leader's caller is answered now. (A leader that stayed until the queue
// was empty was never answered while calls kept coming.)
func (e *Envelope) lead(h *modules.Handler, b *batcher, name string, mine *pending) {
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.running--
			if b.running == 0 {
				e.batch.mu.Lock()
				if e.batch.m[name] == b {
					delete(e.batch.m, name)
				}
				e.batch.mu.Unlock()
			}
			b.mu.Unlock()
			return
		}
		n := min(len(b.pending), MaxBatch)
		calls := b.pending[:n:n]
		b.pending = b.pending[n:]
		b.mu.Unlock()
		e.runBatch(h, calls)
		if mine != nil && slices.Contains(calls, mine) {
			go e.lead(h, b, name, nil)
			return
		}
	}
}

// runBatch runs calls in one transaction and delivers every call's outcome. Calls the batch
// could not carry out by themselves, and all of them if the transaction fails, run alone.
func (e *Envelope) runBatch(h *modules.Handler, calls []*pending) {
	// The leader's cancellation must not fail the others' calls.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(calls[0].ctx), 30*time.Second)
	defer cancel()
	e.metrics.Batch(h.Info.FullName(), len(calls))
	out := make([]*outcome, len(calls))
	var alone []int
	err := pgx.BeginFunc(ctx, e.rt.DB.Pool, func(tx pgx.Tx) error {
		out = make([]*outcome, len(calls))
		alone = nil
		var live []int
		for i, c := range calls {
			if c.ctx.Err() != nil {
				out[i] = &outcome{err: e.mapError(c.ctx, h, c.ctx.Err())}
				continue
			}
			if c.key != "" {
				replay, found, err := claimKey(ctx, tx, c.p.ID, h.Info.FullName(), c.key, c.hash)
				switch {
				case err != nil && isAPIError(err):
					out[i] = &outcome{err: err}
					continue
				case err != nil:
					return err
				case found && replay == nil:
					alone = append(alone, i) // the same key twice in one batch: the repeat waits
					continue
				case found:
					out[i] = &outcome{res: Result{Replay: replay}}
					continue
				}
			}
			live = append(live, i)
		}
		if len(live) == 0 {
			return nil
		}
		mcalls := make([]*modules.Call, len(live))
		ins := make([]any, len(live))
		for j, i := range live {
			mcalls[j] = &modules.Call{Principal: calls[i].p, Target: calls[i].t, Runtime: e.rt}
			ins[j] = calls[i].in
		}
		res, err := safely(func() ([]modules.BatchResult[any], error) { return h.RunBatch(ctx, tx, e.rt, mcalls, ins) })
		if err != nil {
			return err
		}
		for j, i := range live {
			c, r := calls[i], res[j]
			switch {
			case r.Alone:
				alone = append(alone, i)
				err = releaseKey(ctx, tx, c, h)
			case r.Err != nil:
				out[i] = &outcome{err: e.mapError(ctx, h, r.Err)}
				err = releaseKey(ctx, tx, c, h)
			default:
				out[i] = &outcome{res: Result{Value: r.Out}}
				if c.key != "" {
					err = storeResponse(ctx, tx, c.p.ID, h.Info.FullName(), c.key, r.Out)
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		// The batch as a whole failed (a race the database refereed, a deadlock): nothing of it
		// was written, so every call that has no answer yet runs alone.
		alone = alone[:0]
		for i := range calls {
			if calls[i].ctx.Err() == nil {
				out[i] = nil
				alone = append(alone, i)
			} else {
				out[i] = &outcome{err: e.mapError(calls[i].ctx, h, calls[i].ctx.Err())}
			}
		}
	}
	// The calls sent back run alone at once, side by side, as they would have unbatched: run one
	// after another by the leader, twenty of them waiting for nodes took seconds.
	var wg sync.WaitGroup
	for _, i := range alone {
		c := calls[i]
		wg.Go(func() {
			res, err := e.transactAlone(c.ctx, c.p, h, c.t, c.key, c.hash, c.in)
			out[i] = &outcome{res: res, err: err}
		})
	}
	wg.Wait()
	for i, c := range calls {
		c.done <- *out[i]
	}
}

func releaseKey(ctx context.Context, tx pgx.Tx, c *pending, h *modules.Handler) error {
	if c.key == "" {
		return nil
	}
	_, err := tx.Exec(ctx, `DELETE FROM compute.idempotency_keys WHERE principal_id = $1 AND method = $2 AND key = $3`,
		c.p.ID, h.Info.FullName(), c.key)
	return err
}
