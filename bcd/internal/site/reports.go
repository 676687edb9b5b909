package site

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"
)

// How the reporter retries: exponential backoff between these bounds, each attempt bounded too;
// at shutdown, what is still queued gets one attempt each within reportDrain.
const (
	reportRetryMin = 250 * time.Millisecond
	reportRetryMax = 30 * time.Second
	reportAttempt  = 30 * time.Second
	reportDrain    = 2 * time.Second
)

type report struct {
	kind    string
	payload any
	done    chan error // if set, told once the report is delivered (nil) or rejected
}

// reporter sends the site's reports to its Upstream from one goroutine, in order, each retried
// with backoff until it is delivered or rejected. Its queue is bounded: offer refuses a report
// when it is full (the ramdisk is told to retry), send waits for room.
type reporter struct {
	up       Upstream
	log      *slog.Logger
	q        chan report
	retryMin time.Duration
	retryMax time.Duration
}

func newReporter(up Upstream, size int, log *slog.Logger) *reporter {
	return &reporter{up: up, log: log, q: make(chan report, size), retryMin: reportRetryMin, retryMax: reportRetryMax}
}

// offer queues a report if there is room.
func (r *reporter) offer(kind string, payload any) bool {
	select {
	case r.q <- report{kind: kind, payload: payload}:
		return true
	default:
		r.log.Warn("report queue full", "kind", kind, "queued", len(r.q))
		return false
	}
}

// errNotDelivered is a report queued but not delivered within the caller's patience.
var errNotDelivered = errors.New("site: the report is not delivered yet")

// deliverWithin queues a report if there is room and waits until it is delivered (nil),
// rejected (ErrRejected), or wait passes (errNotDelivered: it stays queued, and the caller,
// a ramdisk, posts it again; the control plane takes a report twice). A ramdisk told its
// progress is in has it recorded by the control plane, so that a site killed at any moment
// loses none of it.
func (r *reporter) deliverWithin(wait time.Duration, kind string, payload any) error {
	done := make(chan error, 1)
	select {
	case r.q <- report{kind: kind, payload: payload, done: done}:
	default:
		r.log.Warn("report queue full", "kind", kind, "queued", len(r.q))
		return errNotDelivered
	}
	select {
	case err := <-done:
		return err
	case <-time.After(wait):
		return errNotDelivered
	}
}

// send queues a report, waiting for room until ctx ends.
func (r *reporter) send(ctx context.Context, kind string, payload any) error {
	select {
	case r.q <- report{kind: kind, payload: payload}:
		return nil
	case <-ctx.Done():
		r.log.Warn("report not queued: stopping", "kind", kind, "payload", payload)
		return ctx.Err()
	}
}

// run delivers reports until ctx ends, then gives what is left one attempt each.
func (r *reporter) run(ctx context.Context) {
	var pending *report
	for pending == nil {
		select {
		case <-ctx.Done():
			r.drain(nil)
			return
		case rep := <-r.q:
			if !r.deliver(ctx, rep) {
				pending = &rep
			}
		}
	}
	r.drain(pending)
}

// deliver tries rep until it is delivered or rejected (true), or ctx ends (false).
func (r *reporter) deliver(ctx context.Context, rep report) bool {
	wait := r.retryMin
	for attempt := 1; ; attempt++ {
		err := r.attempt(ctx, rep, reportAttempt)
		if err == nil || errors.Is(err, ErrRejected) {
			if err != nil {
				r.log.Error("report rejected by the control plane: dropped", "kind", rep.kind, "payload", rep.payload, "err", err)
			}
			if rep.done != nil {
				rep.done <- err
			}
			return true
		}
		r.log.Warn("report not delivered: retrying", "kind", rep.kind, "attempt", attempt, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(jitter(wait)):
		}
		wait = min(2*wait, r.retryMax)
	}
}

func (r *reporter) attempt(ctx context.Context, rep report, limit time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return r.up.Report(actx, rep.kind, rep.payload)
}

// drain gives pending and what is queued one attempt each, within reportDrain; what is not
// delivered then is logged, one line each, and lost (the site keeps no reports across restarts:
// a ramdisk posts its progress again, the cache reports its images again at start).
func (r *reporter) drain(pending *report) {
	ctx, cancel := context.WithTimeout(context.Background(), reportDrain)
	defer cancel()
	left := []report{}
	if pending != nil {
		left = append(left, *pending)
	}
	for {
		select {
		case rep := <-r.q:
			left = append(left, rep)
			continue
		default:
		}
		break
	}
	for _, rep := range left {
		if err := r.attempt(ctx, rep, reportDrain); err != nil {
			r.log.Warn("report not delivered before stopping: lost", "kind", rep.kind, "payload", rep.payload, "err", err)
		}
	}
}

// jitter spreads a wait by ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
