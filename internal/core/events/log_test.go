package events_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLogOrderSurvivesCommitsOutOfOrder: an event written first by a transaction that commits
// last is not skipped by a reader that resumed after the events that committed before it.
func TestLogOrderSurvivesCommitsOutOfOrder(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	long, err := env.DB.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	if err := events.Emit(ctx, long, "node.offline", "root", "first-written", nil); err != nil {
		t.Fatal(err)
	}
	if err := events.Emit(ctx, env.DB.Pool, "node.online", "root", "first-committed", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Sequence(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	seen, err := events.List(ctx, env.DB.Pool, "root", 0, "", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0].Subject != "first-committed" || seen[0].ID != 1 {
		t.Fatalf("before the long transaction commits: %+v, want first-committed as event 1", seen)
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Sequence(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	next, err := events.List(ctx, env.DB.Pool, "root", seen[0].ID, "", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(next) != 1 || next[0].Subject != "first-written" || next[0].ID != 2 {
		t.Fatalf("after event 1, once the long transaction committed: %+v, want first-written as event 2", next)
	}
}

// TestReaderSeesEveryCommittedEventOnceInOrder: writers commit events in transactions of random
// length (some rolled back) while sequencers of two "processes" and a reader that resumes after
// the last id it saw run at once. The reader sees every committed event exactly once, the ids are
// 1..n with no gap, and no rolled-back event appears.
func TestReaderSeesEveryCommittedEventOnceInOrder(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const writers, perWriter = 6, 25
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := map[string]bool{}
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				subject := fmt.Sprintf("w%d-%d", w, i)
				keep := rand.IntN(5) != 0
				err := env.DB.Tx(ctx, func(tx pgx.Tx) error {
					if err := events.Emit(ctx, tx, "node.online", "root", subject, nil); err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond) // a transaction of random length: the behaviour under test
					if !keep {
						return errRollback
					}
					return nil
				})
				if err != nil && err != errRollback {
					t.Error(err)
					return
				}
				if keep {
					mu.Lock()
					committed[subject] = true
					mu.Unlock()
				}
			}
		})
	}
	sequencing := make(chan struct{})
	var swg sync.WaitGroup
	for range 2 {
		swg.Go(func() {
			for {
				if _, err := events.Sequence(ctx, env.DB); err != nil && ctx.Err() == nil {
					t.Error(err)
				}
				select {
				case <-sequencing:
					return
				case <-time.After(time.Duration(rand.IntN(10)) * time.Millisecond):
				}
			}
		})
	}
	var got []string
	var after int64
	read := func() {
		page, err := events.List(ctx, env.DB.Pool, "root", after, "", "", 7)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			if e.ID != after+1 {
				t.Fatalf("event %d after %d: a gap", e.ID, after)
			}
			after = e.ID
			got = append(got, e.Subject)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			read()
			time.Sleep(3 * time.Millisecond) // the reader's pace while writers run, not a wait
		}
	}
	close(sequencing)
	swg.Wait()
	if _, err := events.Sequence(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	for before := -1; before != len(got); {
		before = len(got)
		read()
	}
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s] {
			t.Errorf("%s seen twice", s)
		}
		if !committed[s] {
			t.Errorf("%s seen, but it was rolled back", s)
		}
		seen[s] = true
	}
	if len(seen) != len(committed) {
		t.Errorf("saw %d events of %d committed", len(seen), len(committed))
	}
}

var errRollback = fmt.Errorf("roll back")
