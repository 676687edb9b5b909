package webhooks_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/riverqueue/river"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/jobs"
	"github.com/better-compute/compute/internal/core/webhooks"
)

// TestDeliveriesOfATenantWithABacklogQueueBehindOthers: tenants share the delivery queue, so a
// tenant whose endpoints made a flood of deliveries (2,000 endpoints, or a burst of events) must
// not hold back every other tenant's. River works the queue by priority first: a fan-out gives a
// tenant's first webhooks.FairShare deliveries of its backlog the first priority and each further
// FairShare the next, and enqueues a round of each tenant before the next round of any, so a
// quiet tenant's delivery is worked before the flooding tenant's backlog.
func TestDeliveriesOfATenantWithABacklogQueueBehindOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.Webhooks.AllowPrivateTargets = true }})
	loud, loudKey := env.Tenant(t, "loud")
	quiet, quietKey := env.Tenant(t, "quiet")
	for _, key := range []string{loudKey, quietKey} {
		if _, err := env.Compute.API.Webhooks.Create(ctx, key, api.CreateWebhook{URL: "https://hooks.example.com/in"}); err != nil {
			t.Fatal(err)
		}
	}
	// A client that enqueues only (it has no queues to work), knowing the deliveries' kind.
	kinds := river.NewWorkers()
	river.AddWorker(kinds, river.WorkFunc(func(context.Context, *river.Job[deliverKind]) error { return nil }))
	jc, err := jobs.New(jobs.Config{Pool: env.DB.Pool, Workers: kinds})
	if err != nil {
		t.Fatal(err)
	}
	emit := func(tenant string, n int) {
		t.Helper()
		for i := range n {
			if err := events.Emit(ctx, env.DB.Pool, "node.online", tenant, fmt.Sprintf("n%d", i), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	fanout := func() {
		t.Helper()
		if _, err := events.Sequence(ctx, env.DB); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := webhooks.Fanout(ctx, env.DB, jc)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	queued := func() []queuedJob {
		t.Helper()
		rows, err := env.DB.Pool.Query(ctx, `SELECT j.id, j.priority, w.tenant_id FROM compute.river_job j
			JOIN compute.webhook_deliveries d ON d.id = (j.args->>'delivery')::bigint JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id
			WHERE j.queue = $1 ORDER BY j.priority, j.scheduled_at, j.id`, webhooks.Queue) // River's order of work
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []queuedJob
		for rows.Next() {
			var j queuedJob
			if err := rows.Scan(&j.id, &j.priority, &j.tenant); err != nil {
				t.Fatal(err)
			}
			out = append(out, j)
		}
		return out
	}
	// One fan-out of a burst of the loud tenant's events and then one of the quiet tenant's.
	emit(loud, 3*webhooks.FairShare)
	emit(quiet, 1)
	fanout()
	q := queued()
	if len(q) != 3*webhooks.FairShare+1 {
		t.Fatalf("%d jobs queued, want %d", len(q), 3*webhooks.FairShare+1)
	}
	if q[0].tenant != quiet && q[1].tenant != quiet {
		t.Fatalf("the quiet tenant's delivery is not worked in the first round: %+v", q[:3])
	}
	for i, j := range q {
		if want := 1 + min(3, i/webhooks.FairShare); j.tenant == loud && i > 0 && j.priority != want && j.priority != want-1 {
			t.Fatalf("the loud tenant's job at place %d has priority %d, want about %d", i, j.priority, want)
		}
	}
	if last := q[len(q)-1]; last.tenant != loud || last.priority < 3 {
		t.Fatalf("the last job of the loud tenant's backlog has priority %d, want the third at least", last.priority)
	}
	// The backlog counts across fan-outs: a later event of the loud tenant queues behind its
	// backlog, while the quiet tenant's next one is first again.
	emit(loud, 1)
	emit(quiet, 1)
	fanout()
	q = queued()
	newest := map[string]int{} // tenant → place of its newest job
	for i, j := range q {
		if k, ok := newest[j.tenant]; !ok || j.id > q[k].id {
			newest[j.tenant] = i
		}
	}
	if p := newest[quiet]; p > webhooks.FairShare+2 {
		t.Fatalf("the quiet tenant's second delivery is worked at place %d, behind the loud tenant's backlog", p)
	}
	if j := q[newest[loud]]; j.priority < 3 {
		t.Fatalf("the loud tenant's new delivery, behind %d pending, has priority %d, want at least 3", 3*webhooks.FairShare, j.priority)
	}
	// A redelivery (as a wake-up of the next of a subject) is a lone job: it queues by its
	// tenant's backlog too, not at the first priority.
	var first int64
	if err := env.DB.Pool.QueryRow(ctx, `SELECT min(d.id) FROM compute.webhook_deliveries d JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id
		WHERE w.tenant_id = $1`, loud).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Webhooks.Redeliver(ctx, loudKey, api.RedeliverWebhook{Delivery: first}); err != nil {
		t.Fatal(err)
	}
	var priority int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT priority FROM compute.river_job WHERE (args->>'delivery')::bigint = $1 ORDER BY id DESC LIMIT 1`,
		first).Scan(&priority); err != nil || priority < 3 {
		t.Fatalf("the loud tenant's redelivery has priority %d (%v), want at least 3 behind its backlog", priority, err)
	}
}

// queuedJob is a delivery's job as River will take it.
type queuedJob struct {
	id       int64
	priority int
	tenant   string
}

// deliverKind names the deliveries' job kind, for a client that only enqueues them.
type deliverKind struct{}

func (deliverKind) Kind() string { return "webhook.deliver" }
