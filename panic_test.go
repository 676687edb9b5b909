package compute_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

type boomIn struct {
	Panic   bool `json:"panic"`
	PauseMS int  `json:"pauseMs"` // how long a batch of it takes
}
type boomOut struct {
	OK bool `json:"ok"`
}

var (
	boomBatched = api.NewMethod[boomIn, boomOut]("booms", "batched", true, "compute-boom", "test", "Panics when asked, in a batch.")
	boomAlone   = api.NewMethod[boomIn, boomOut]("booms", "alone", true, "compute-boom", "test", "Panics when asked.")
)

// boomModule's methods panic when their input asks them to, after writing in their transaction.
func boomModule() testModule {
	run := func(ctx context.Context, c *modules.Call, in boomIn) (boomOut, error) {
		if _, err := c.Tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS boom_probe (x int)`); err != nil {
			return boomOut{}, err
		}
		if in.Panic {
			panic("boom")
		}
		return boomOut{OK: true}, nil
	}
	batch := func(ctx context.Context, tx pgx.Tx, _ *modules.Runtime, calls []*modules.BatchCall[boomIn]) ([]modules.BatchResult[boomOut], error) {
		out := make([]modules.BatchResult[boomOut], len(calls))
		time.Sleep(time.Duration(calls[0].In.PauseMS) * time.Millisecond) // a slow batch, as the test asks: the behaviour under test
		for i, c := range calls {
			if c.In.Panic {
				panic("boom in a batch")
			}
			out[i].Out = boomOut{OK: true}
		}
		return out, nil
	}
	return testModule{name: "booms", register: func(r *modules.Registry) error {
		r.ResourceTypes(iam.ResourceType{Name: "compute-boom"})
		r.Actions(modules.ActionsFor(boomBatched.Info(), boomAlone.Info())...)
		modules.HandleBatched(r, boomBatched, nil, run, func(modules.Target, boomIn) string { return "one" }, batch)
		modules.Handle(r, boomAlone, nil, run)
		return nil
	}}
}

// TestPanicInAMethod: a method that panics answers internal to its caller, in-process and over
// HTTP; the host goes on, the other calls of its batch are answered, and its batch key is not
// left stuck.
func TestPanicInAMethod(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{boomModule()}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make([]error, 24)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = compute.Invoke(ctx, env.Compute, env.RootKey, boomBatched, boomIn{Panic: i%3 == 0})
		})
	}
	wg.Wait()
	for i, err := range errs {
		var ae *api.Error
		switch {
		case i%3 == 0 && (!errors.As(err, &ae) || ae.Code != api.CodeInternal):
			t.Errorf("call %d panicked: %v; want internal", i, err)
		case i%3 != 0 && err != nil:
			t.Errorf("call %d did not panic, but: %v", i, err)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("calls waited for a batch that never answered")
	}
	// The batch key is free again.
	if out, err := compute.Invoke(ctx, env.Compute, env.RootKey, boomBatched, boomIn{}); err != nil || !out.OK {
		t.Fatalf("a call after the panics: %+v, %v", out, err)
	}
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, boomAlone, boomIn{Panic: true}); err == nil || !strings.Contains(err.Error(), "internal error in booms.alone") {
		t.Fatalf("a lone call that panicked: %v; want internal", err)
	}

	url := env.Server(t)
	for _, m := range []string{"booms/alone", "booms/batched"} {
		c := post(t, url, env.RootKey, m, `{"panic": true}`)
		if c.status != http.StatusInternalServerError || c.errCode() != string(api.CodeInternal) || strings.Contains(string(c.raw), "goroutine") {
			t.Errorf("%s that panicked over HTTP: %d %s", m, c.status, c.raw)
		}
		if c := post(t, url, env.RootKey, m, `{}`); c.status != http.StatusOK {
			t.Errorf("%s after a panic: %d %s", m, c.status, c.raw)
		}
	}
}

// TestBatchLeaderIsAnswered: the call that leads a batch is answered when its own batch has run,
// though calls of its key keep coming. (A leader once ran batches until the queue was empty, and
// under steady load its caller waited a minute.)
func TestBatchLeaderIsAnswered(t *testing.T) {
	// Not parallel: it bounds the latency of calls under its own load, which tests beside it would add to.
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{boomModule()}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Load for twice as long as the slowest call may take: a leader that ran batches until the
	// queue was empty would be answered only when the load stops; a loaded CI machine still
	// answers a batch of 20 ms pauses well inside the bound.
	const bound = 3 * time.Second
	stop := time.Now().Add(2 * bound)
	var mu sync.Mutex
	var slowest time.Duration
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				start := time.Now()
				if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, boomBatched, boomIn{PauseMS: 20}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				slowest = max(slowest, time.Since(start))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if slowest > bound {
		t.Fatalf("the slowest batched call took %s under steady load; a batch takes milliseconds", slowest)
	}
}
