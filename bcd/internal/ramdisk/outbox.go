package ramdisk

import (
	"context"
	"sync"

	"github.com/better-compute/compute/metal/siteapi"
)

// outbox holds the progress not yet posted, in order, so that a task never waits on the site
// (a download goes on while its progress is retried) and nothing is dropped. Download
// progress waiting behind a slow post is coalesced: only the latest count is posted.
type outbox struct {
	mu      sync.Mutex
	queue   []siteapi.Progress
	sending bool          // queue[0] is being posted
	emptied chan struct{} // closed when the queue is emptied
	wake    chan struct{} // a poster waiting for work
	once    sync.Once
}

func (o *outbox) init() {
	o.once.Do(func() { o.wake = make(chan struct{}, 1) })
}

// add queues p behind what is waiting.
func (o *outbox) add(p siteapi.Progress) {
	o.init()
	o.mu.Lock()
	n := len(o.queue)
	switch {
	case n == 0:
		o.emptied = make(chan struct{})
		o.queue = append(o.queue, p)
	case p.Phase == siteapi.PhaseDownload && o.queue[n-1].Phase == siteapi.PhaseDownload &&
		o.queue[n-1].Task == p.Task && !(n == 1 && o.sending):
		o.queue[n-1] = p
	default:
		o.queue = append(o.queue, p)
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// flush waits until everything added has been posted, or ctx is done.
func (o *outbox) flush(ctx context.Context) error {
	o.mu.Lock()
	if len(o.queue) == 0 {
		o.mu.Unlock()
		return nil
	}
	emptied := o.emptied
	o.mu.Unlock()
	select {
	case <-emptied:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run posts what is added, in order, with send (which retries until the site takes it), until
// ctx is done.
func (o *outbox) run(ctx context.Context, send func(context.Context, siteapi.Progress)) {
	o.init()
	for {
		o.mu.Lock()
		if len(o.queue) == 0 {
			o.mu.Unlock()
			select {
			case <-o.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		p := o.queue[0]
		o.sending = true
		o.mu.Unlock()
		send(ctx, p)
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		o.queue = o.queue[1:]
		o.sending = false
		if len(o.queue) == 0 {
			close(o.emptied)
		}
		o.mu.Unlock()
	}
}
