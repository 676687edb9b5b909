package compute

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/internal/core/jobs"
	"github.com/better-compute/compute/internal/core/workflow"
	"github.com/better-compute/compute/modules"
)

// coreModule registers what the envelope itself owns (the idempotency keys and their pruning)
// and the job queue's schema.
type coreModule struct{}

func (coreModule) Name() string { return "core" }

func (coreModule) Register(r *modules.Registry) error {
	river, err := jobs.Migrations()
	if err != nil {
		return err
	}
	r.Migrations(envelope.Migrations, river)
	r.EventTypes(modules.EventType{Name: "action.confirmed", Description: "A call an agent's delegation reserves for its person was confirmed by them and made; its subject is the confirmation (data: method, action, resource, principal)."})
	r.Worker(modules.Worker{Name: "idempotency-prune", Modes: []string{string(ModeWorker)}, Run: pruneIdempotencyKeys})
	return nil
}

// pruneIdempotencyKeys deletes idempotency keys older than envelope.DefaultIdempotencyTTL, every
// ten minutes.
func pruneIdempotencyKeys(ctx context.Context, rt *modules.Runtime) error {
	return modules.Every(ctx, 10*time.Minute, func() error {
		n, err := envelope.PruneIdempotencyKeys(ctx, rt.DB.Pool, envelope.DefaultIdempotencyTTL)
		if n > 0 {
			rt.Logger.DebugContext(ctx, "compute: pruned idempotency keys", "count", n)
		}
		return err
	})
}

func decodeReplay(b []byte, out any) error { return json.Unmarshal(b, out) }

// jobsModule works the registered job queues in the worker process mode. Its client is made in
// New, once the Runtime its workers use exists.
type jobsModule struct{ client *jobs.Client }

func (*jobsModule) Name() string { return "jobs" }

func (m *jobsModule) Register(r *modules.Registry) error {
	r.Worker(modules.Worker{Name: "jobs", Modes: []string{string(ModeWorker)}, Run: func(ctx context.Context, _ *modules.Runtime) error {
		return m.client.Run(ctx)
	}})
	return nil
}

// newJobs makes the job client of the queues reg holds, their workers bound to rt.
func newJobs(o Options, reg *modules.Registry, rt *modules.Runtime) (*jobs.Client, error) {
	for _, name := range reg.WorkflowNames() {
		w, _ := reg.LookupWorkflow(name)
		for _, st := range w.Steps {
			if st.Timeout+workflow.Bookkeeping >= o.JobRescueAfter {
				return nil, &OptionError{Field: "JobRescueAfter", Problem: fmt.Sprintf("(%s) must exceed the timeout of workflow %s's step %s (%s) by more than %s, or a slow attempt would be run twice at once", o.JobRescueAfter, w.Name, st.Name, st.Timeout, workflow.Bookkeeping)}
			}
		}
	}
	workers := river.NewWorkers()
	var queues []jobs.Queue
	var periodic []*river.PeriodicJob
	for _, q := range reg.JobQueues() {
		for _, p := range q.Periodic {
			queue := q.Name
			periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(p.Every), func() (river.JobArgs, *river.InsertOpts) {
				return p.Args(), &river.InsertOpts{Queue: queue}
			}, &river.PeriodicJobOpts{RunOnStart: true}))
		}
		if err := q.AddWorkers(workers, rt); err != nil {
			return nil, fmt.Errorf("compute: job queue %s: %w", q.Name, err)
		}
		n := q.MaxWorkers
		if n <= 0 {
			n = 10
		}
		queues = append(queues, jobs.Queue{Name: q.Name, MaxWorkers: n})
	}
	c, err := jobs.New(jobs.Config{Pool: o.Database.Pool, Logger: o.Logger, Workers: workers, Queues: queues, RescueAfter: o.JobRescueAfter, Periodic: periodic})
	if err != nil {
		return nil, fmt.Errorf("compute: %w", err)
	}
	return c, nil
}
