package ramdisk

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
	"github.com/google/go-cmp/cmp"
)

// TestOutboxKeepsOrderAndCoalescesDownloads holds the first post while more progress is
// added: everything is posted in order, the waiting download counts collapse to the latest,
// the one in flight is not replaced, and flush returns once all is posted.
func TestOutboxKeepsOrderAndCoalescesDownloads(t *testing.T) {
	t.Parallel()
	var (
		o       outbox
		mu      sync.Mutex
		posted  []siteapi.Progress
		release = make(chan struct{})
		first   = make(chan struct{})
	)
	send := func(ctx context.Context, p siteapi.Progress) {
		mu.Lock()
		n := len(posted)
		posted = append(posted, p)
		mu.Unlock()
		if n == 0 {
			close(first)
			<-release
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { o.run(ctx, send) })

	dl := func(n int64) siteapi.Progress {
		return siteapi.Progress{Task: "t", Phase: siteapi.PhaseDownload, Bytes: n, Total: 100}
	}
	o.add(dl(0))
	<-first // dl(0) is in flight
	for _, p := range []siteapi.Progress{dl(10), dl(20), dl(30), {Task: "t", Phase: siteapi.PhaseVerify}, dl(40), dl(50)} {
		o.add(p)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- o.flush(ctx) }()
	select {
	case <-flushed:
		t.Fatal("flush returned while a post was held")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	want := []siteapi.Progress{dl(0), dl(30), {Task: "t", Phase: siteapi.PhaseVerify}, dl(50)}
	mu.Lock()
	defer mu.Unlock()
	if d := cmp.Diff(want, posted); d != "" {
		t.Errorf("posted (-want +got):\n%s", d)
	}
}
