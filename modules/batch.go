package modules

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
)

// BatchCall is one call of a batch: what the envelope knows of it after its IAM decision.
type BatchCall[In any] struct {
	Call
	In In
}

// BatchResult is the outcome of one call of a batch. A call with Err wrote nothing; one with
// Alone set is run again by itself, on the ordinary path, after the batch commits.
type BatchResult[Out any] struct {
	Out   Out
	Err   error
	Alone bool
}

// BatchFunc carries out several calls of one method in one transaction. It returns a result per
// call, in order, and must write nothing for a call whose result is an error or Alone. An error
// of its own aborts the batch, and every call then runs alone.
type BatchFunc[In, Out any] func(ctx context.Context, tx pgx.Tx, rt *Runtime, calls []*BatchCall[In]) ([]BatchResult[Out], error)

// batching is the type-erased batch side of a Handler.
type batching struct {
	key func(Target, any) string
	run func(ctx context.Context, tx pgx.Tx, rt *Runtime, calls []*Call, ins []any) ([]BatchResult[any], error)
}

// HandleBatched registers m like Handle, and also lets the envelope run concurrent calls whose
// key matches in one transaction (group commit): under load, many placements share one
// candidate scan, one write and one commit. run remains the path for a lone call.
func HandleBatched[In, Out any](r *Registry, m api.Method[In, Out], target TargetFunc[In], run RunFunc[In, Out],
	key func(Target, In) string, batch BatchFunc[In, Out]) {
	Handle(r, m, target, run)
	h := r.handlers[m.FullName()]
	if h == nil {
		return
	}
	h.batch = &batching{
		key: func(t Target, in any) string { return key(t, in.(In)) },
		run: func(ctx context.Context, tx pgx.Tx, rt *Runtime, calls []*Call, ins []any) ([]BatchResult[any], error) {
			typed := make([]*BatchCall[In], len(calls))
			for i := range calls {
				typed[i] = &BatchCall[In]{Call: *calls[i], In: ins[i].(In)}
			}
			res, err := batch(ctx, tx, rt, typed)
			if err != nil {
				return nil, err
			}
			if len(res) != len(calls) {
				return nil, fmt.Errorf("batch of %s returned %d results for %d calls", m.FullName(), len(res), len(calls))
			}
			out := make([]BatchResult[any], len(res))
			for i, r := range res {
				out[i] = BatchResult[any]{Out: r.Out, Err: r.Err, Alone: r.Alone}
			}
			return out, nil
		},
	}
}

// BatchKey returns the key under which a call may be batched, or "" when the method does not batch.
func (h *Handler) BatchKey(t Target, in any) string {
	if h.batch == nil {
		return ""
	}
	return h.batch.key(t, in)
}

// RunBatch carries out calls in one transaction.
func (h *Handler) RunBatch(ctx context.Context, tx pgx.Tx, rt *Runtime, calls []*Call, ins []any) ([]BatchResult[any], error) {
	return h.batch.run(ctx, tx, rt, calls, ins)
}
