// Package workflow is the durable workflow engine: runs of the workflows modules register
// (provision.Workflow, the types' public home), their state in compute.workflow_runs and
// compute.workflow_steps (which it alone writes), each step's attempts a River job. A step's
// success, the next step's job and the completion of its own job commit in one transaction, so a
// process may die anywhere (kill -9 mid-step): the step is run again by another process, and no
// step is recorded as done twice. Its Service is modules.Runtime.Workflows; its API group's types
// are api's (api.WorkflowsGet, List, Cancel).
package workflow

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/jobs"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the engine's schema.
var Migrations = postgres.EmbeddedMigrations("workflow", "compute", migrationsFS)

// Queue is the River queue of step attempts.
const Queue = "workflows"

// Bookkeeping is the time an attempt's job is given beyond its step's Timeout, to record it.
const Bookkeeping = 5 * time.Second

// Retry bounds of a failed step: 1 s doubled per attempt, at most 5 min.
const (
	RetryBase = time.Second
	RetryMax  = 5 * time.Minute
)

// The events of runs; the subject of each is the run.
const (
	EventStarted       = "workflow.started"
	EventStepStarted   = "workflow.step_started"
	EventStepRetrying  = "workflow.step_retrying"
	EventStepSucceeded = "workflow.step_succeeded"
	EventSucceeded     = "workflow.succeeded"
	EventFailed        = "workflow.failed"
	EventCancelled     = "workflow.cancelled"
)

// Module registers the engine: its schema, its queue, its events and the workflows group.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "workflow" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceWorkflow, Description: "A run of a workflow: a durable procedure of steps."})
	r.Actions(modules.ActionsFor(api.WorkflowMethods()...)...)
	data := " (data: workflow, subject, step)"
	r.EventTypes(
		modules.EventType{Name: EventStarted, Description: "A workflow run began" + data},
		modules.EventType{Name: EventStepStarted, Description: "A step's first attempt began" + data},
		modules.EventType{Name: EventStepRetrying, Description: "A step's attempt failed and will be retried" + data + ", attempt, error, retryAt"},
		modules.EventType{Name: EventStepSucceeded, Description: "A step succeeded" + data + ", attempts"},
		modules.EventType{Name: EventSucceeded, Description: "Every step of a run succeeded" + data},
		modules.EventType{Name: EventFailed, Description: "A run failed: a step failed for good, ran out of attempts or past its deadline" + data + ", error"},
		modules.EventType{Name: EventCancelled, Description: "A run was cancelled" + data},
	)
	r.JobQueue(modules.JobQueue{Name: Queue, MaxWorkers: 10, AddWorkers: func(w *river.Workers, rt *modules.Runtime) error {
		return river.AddWorkerSafely(w, &stepper{rt: rt})
	}})
	modules.Handle(r, api.WorkflowsGet, runTarget, func(ctx context.Context, c *modules.Call, in api.GetWorkflow) (api.WorkflowRun, error) {
		return Get(ctx, c.Tx, in.Run)
	})
	modules.Handle(r, api.WorkflowsList, nil, list)
	modules.Handle(r, api.WorkflowsCancel, runTarget, func(ctx context.Context, c *modules.Call, in api.GetWorkflow) (api.WorkflowRun, error) {
		if err := (Service{RT: c.Runtime}).Cancel(ctx, c.Tx, in.Run); err != nil {
			return api.WorkflowRun{}, err
		}
		return Get(ctx, c.Tx, in.Run)
	})
	return nil
}

// stepArgs is the River job of one step of a run.
type stepArgs struct {
	Run      string `json:"run"`
	Workflow string `json:"workflow"`
	Step     int    `json:"step"`
}

func (stepArgs) Kind() string { return "workflow.step" }

// Service is provision.Workflows: runs started and cancelled in a caller's transaction.
type Service struct{ RT *modules.Runtime }

var _ provision.Workflows = Service{}

// Start implements provision.Workflows.
func (s Service) Start(ctx context.Context, tx pgx.Tx, in provision.StartWorkflow) (string, error) {
	w, ok := s.RT.Registry.LookupWorkflow(in.Workflow)
	if !ok {
		return "", fmt.Errorf("workflow: no workflow %q is registered", in.Workflow)
	}
	input := in.Input
	if input == nil {
		input = map[string]any{}
	}
	b, err := json.Marshal(input)
	if err != nil {
		return "", fmt.Errorf("workflow %s: encode the input: %w", in.Workflow, err)
	}
	id := uuid.Must(uuid.NewV7()).String()
	names := make([]string, len(w.Steps))
	for i, st := range w.Steps {
		names[i] = st.Name
	}
	if _, err := tx.Exec(ctx, `WITH run AS (INSERT INTO compute.workflow_runs (id, workflow, tenant_id, subject, input, created_by)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING id)
		INSERT INTO compute.workflow_steps (run_id, n, name) SELECT run.id, u.n - 1, u.name FROM run, unnest($7::text[]) WITH ORDINALITY AS u(name, n)`,
		id, in.Workflow, in.TenantID, in.Subject, b, in.CreatedBy, names); err != nil {
		return "", fmt.Errorf("workflow %s: start: %w", in.Workflow, err)
	}
	if err := s.enqueue(ctx, tx, w, id, 0); err != nil {
		return "", err
	}
	return id, s.emit(ctx, tx, EventStarted, in.TenantID, id, w.Name, in.Subject, w.Steps[0].Name, nil)
}

// enqueue makes step n of run current, with its job.
func (s Service) enqueue(ctx context.Context, tx pgx.Tx, w provision.Workflow[*modules.Runtime], run string, n int) error {
	// One attempt more than the step's: an attempt lost with its process (River rescues the job)
	// still finds the run and fails it, rather than leaving it running for ever.
	job, err := s.RT.Jobs.InsertTx(ctx, tx, stepArgs{Run: run, Workflow: w.Name, Step: n},
		&river.InsertOpts{Queue: Queue, MaxAttempts: w.Steps[n].MaxAttempts + 1})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE compute.workflow_runs SET step = $2, job_id = $3 WHERE id = $1`, run, n, job)
	return err
}

func (s Service) emit(ctx context.Context, q postgres.Querier, typ, tenant, run, workflow, subject, step string, more map[string]any) error {
	data := map[string]any{"workflow": workflow, "subject": subject, "step": step}
	for k, v := range more {
		data[k] = v
	}
	return s.RT.Events.Emit(ctx, q, modules.Event{Type: typ, TenantID: tenant, Subject: run, Data: data})
}

// Cancel implements provision.Workflows.
func (s Service) Cancel(ctx context.Context, tx pgx.Tx, runID string) error {
	var tenant, workflow, subject, step string
	var job *int64
	var input json.RawMessage
	err := tx.QueryRow(ctx, `UPDATE compute.workflow_runs r SET state = 'cancelled', finished_at = compute.compute_now()
		FROM compute.workflow_steps s WHERE r.id = $1 AND r.state = 'running' AND s.run_id = r.id AND s.n = r.step
		RETURNING r.tenant_id, r.workflow, r.subject, s.name, r.job_id, r.input`, runID).Scan(&tenant, &workflow, &subject, &step, &job, &input)
	if errors.Is(err, pgx.ErrNoRows) {
		var state string
		if err := tx.QueryRow(ctx, `SELECT state FROM compute.workflow_runs WHERE id = $1`, runID).Scan(&state); errors.Is(err, pgx.ErrNoRows) {
			return api.NotFound("workflow run", runID)
		} else if err != nil {
			return err
		}
		return api.Errorf(api.CodeFailedPrecondition, "the workflow run has %s: only a running one can be cancelled", state).With("reason", "finished")
	}
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.workflow_steps SET state = 'cancelled', finished_at = CASE WHEN state = 'running' THEN compute.compute_now() END
		WHERE run_id = $1 AND state IN ('pending', 'running')`, runID); err != nil {
		return err
	}
	if job != nil {
		if err := s.RT.Jobs.CancelTx(ctx, tx, *job); err != nil {
			return err
		}
	}
	if err := s.onEnd(ctx, tx, &provision.RunEnd[*modules.Runtime]{RunID: runID, Workflow: workflow, TenantID: tenant, Subject: subject, Input: input,
		State: api.WorkflowCancelled}); err != nil {
		return err
	}
	return s.emit(ctx, tx, EventCancelled, tenant, runID, workflow, subject, step, nil)
}

// onEnd runs the workflow's OnEnd hook, if it has one, in the transaction ending the run.
func (s Service) onEnd(ctx context.Context, tx pgx.Tx, e *provision.RunEnd[*modules.Runtime]) error {
	wf, ok := s.RT.Registry.LookupWorkflow(e.Workflow)
	if !ok || wf.OnEnd == nil {
		return nil
	}
	e.Runtime = s.RT
	if err := wf.OnEnd(ctx, tx, e); err != nil {
		return fmt.Errorf("workflow %s: the end of run %s: %w", e.Workflow, e.RunID, err)
	}
	return nil
}

// stepper works step jobs.
type stepper struct {
	river.WorkerDefaults[stepArgs]
	rt *modules.Runtime
}

func (w *stepper) step(args stepArgs) (provision.Workflow[*modules.Runtime], provision.Step[*modules.Runtime], bool) {
	wf, ok := w.rt.Registry.LookupWorkflow(args.Workflow)
	if !ok || args.Step < 0 || args.Step >= len(wf.Steps) {
		return wf, provision.Step[*modules.Runtime]{}, false
	}
	return wf, wf.Steps[args.Step], true
}

// Timeout bounds an attempt with its bookkeeping; the step itself gets its own Timeout.
func (w *stepper) Timeout(j *river.Job[stepArgs]) time.Duration {
	_, st, ok := w.step(j.Args)
	if !ok {
		return time.Minute
	}
	return st.Timeout + Bookkeeping
}

// NextRetry is the backoff after a failed attempt.
func (w *stepper) NextRetry(j *river.Job[stepArgs]) time.Time {
	return time.Now().Add(jobs.Backoff(RetryBase, RetryMax, j.ID, j.Attempt))
}

// run is what an attempt reads of its run.
type run struct {
	state, tenant, subject string
	step                   int
	input                  json.RawMessage
	stepState              string
	startedAt              *time.Time
	now                    time.Time
}

func (w *stepper) Work(ctx context.Context, j *river.Job[stepArgs]) error {
	svc := Service{RT: w.rt}
	db := w.rt.DB
	var r run
	err := db.Pool.QueryRow(ctx, `SELECT r.state, r.tenant_id, r.subject, r.step, r.input, s.state, s.started_at, compute.compute_now()
		FROM compute.workflow_runs r JOIN compute.workflow_steps s ON s.run_id = r.id AND s.n = $2 WHERE r.id = $1`,
		j.Args.Run, j.Args.Step).Scan(&r.state, &r.tenant, &r.subject, &r.step, &r.input, &r.stepState, &r.startedAt, &r.now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the run is gone
	}
	if err != nil {
		return err
	}
	if r.state != api.WorkflowRunning || r.step != j.Args.Step || r.stepState != api.StepPending && r.stepState != api.StepRunning {
		return nil // finished, cancelled, or this step is done: a repeated job stands down
	}
	wf, st, ok := w.step(j.Args)
	if !ok {
		return w.fail(ctx, j, wf, "", r, j.Attempt-1, fmt.Sprintf("workflow %s (step %d) is not registered in this process", j.Args.Workflow, j.Args.Step))
	}
	if j.Attempt > st.MaxAttempts {
		return w.fail(ctx, j, wf, st.Name, r, j.Attempt-1, fmt.Sprintf("step %s: its last attempt was lost with its process", st.Name))
	}
	if r.startedAt == nil {
		err := db.Tx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE compute.workflow_steps SET state = 'running', started_at = compute.compute_now()
				WHERE run_id = $1 AND n = $2 AND state = 'pending'`, j.Args.Run, j.Args.Step)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			return svc.emit(ctx, tx, EventStepStarted, r.tenant, j.Args.Run, wf.Name, r.subject, st.Name, nil)
		})
		if err != nil {
			return err
		}
		started := r.now
		r.startedAt = &started
	} else if r.now.Sub(*r.startedAt) > st.Deadline {
		return w.fail(ctx, j, wf, st.Name, r, j.Attempt-1, fmt.Sprintf("step %s did not finish within its deadline of %s", st.Name, st.Deadline))
	}
	outputs, err := w.outputs(ctx, j.Args.Run, j.Args.Step)
	if err != nil {
		return err
	}
	sr := &provision.StepRun[*modules.Runtime]{RunID: j.Args.Run, Workflow: wf.Name, Step: st.Name, TenantID: r.tenant, Subject: r.subject,
		Attempt: j.Attempt, Input: r.input, Outputs: outputs, Runtime: w.rt}
	stepCtx, cancel := context.WithTimeout(ctx, st.Timeout)
	out, runErr := runStep(stepCtx, st, sr)
	cancel()
	if wait, ok := provision.IsWait(runErr); ok {
		if _, err := db.Pool.Exec(ctx, `UPDATE compute.workflow_steps SET note = $3 WHERE run_id = $1 AND n = $2`, j.Args.Run, j.Args.Step, wait.Why); err != nil {
			return err
		}
		return river.JobSnooze(max(wait.After, 10*time.Millisecond))
	}
	if runErr != nil {
		var perm *provision.PermanentError
		if errors.As(runErr, &perm) || j.Attempt >= st.MaxAttempts {
			return w.fail(ctx, j, wf, st.Name, r, j.Attempt, fmt.Sprintf("step %s, attempt %d: %v", st.Name, j.Attempt, runErr))
		}
		next := time.Now().Add(jobs.Backoff(RetryBase, RetryMax, j.ID, j.Attempt))
		err := db.Tx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE compute.workflow_steps SET attempts = $3, error = $4, note = ''
				WHERE run_id = $1 AND n = $2 AND state = 'running'`, j.Args.Run, j.Args.Step, j.Attempt, runErr.Error())
			if err != nil || tag.RowsAffected() == 0 {
				return err // cancelled meanwhile
			}
			return svc.emit(ctx, tx, EventStepRetrying, r.tenant, j.Args.Run, wf.Name, r.subject, st.Name,
				map[string]any{"attempt": j.Attempt, "error": runErr.Error(), "retryAt": next.UTC().Format(time.RFC3339Nano)})
		})
		if err != nil {
			return err
		}
		return fmt.Errorf("workflow %s run %s step %s: %w", wf.Name, j.Args.Run, st.Name, runErr)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return w.fail(ctx, j, wf, st.Name, r, j.Attempt, fmt.Sprintf("step %s: encode its output: %v", st.Name, err))
	}
	return db.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE compute.workflow_steps SET state = 'succeeded', attempts = $3, output = $4, note = '', error = '', finished_at = compute.compute_now()
			WHERE run_id = $1 AND n = $2 AND state = 'running'
			  AND EXISTS (SELECT 1 FROM compute.workflow_runs WHERE id = $1 AND state = 'running' AND step = $2)`, j.Args.Run, j.Args.Step, j.Attempt, b)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			if err := svc.emit(ctx, tx, EventStepSucceeded, r.tenant, j.Args.Run, wf.Name, r.subject, st.Name, map[string]any{"attempts": j.Attempt}); err != nil {
				return err
			}
			if next := j.Args.Step + 1; next < len(wf.Steps) {
				err = svc.enqueue(ctx, tx, wf, j.Args.Run, next)
			} else {
				err = w.finish(ctx, tx, wf, st.Name, r, j.Args.Run, api.WorkflowSucceeded, "")
			}
			if err != nil {
				return err
			}
		}
		// The job completes with what it recorded: dying now leaves nothing to redo.
		_, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j)
		return err
	})
}

// runStep runs a step, a panic in it being its failure rather than the process's.
func runStep(ctx context.Context, st provision.Step[*modules.Runtime], sr *provision.StepRun[*modules.Runtime]) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the step panicked: %v", p)
		}
	}()
	return st.Run(ctx, sr)
}

// outputs are the outputs of the steps before n.
func (w *stepper) outputs(ctx context.Context, run string, n int) (map[string]json.RawMessage, error) {
	rows, err := w.rt.DB.Pool.Query(ctx, `SELECT name, output FROM compute.workflow_steps WHERE run_id = $1 AND n < $2 AND output IS NOT NULL`, run, n)
	if err != nil {
		return nil, err
	}
	out := map[string]json.RawMessage{}
	var name string
	var b []byte
	_, err = pgx.ForEachRow(rows, []any{&name, &b}, func() error {
		out[name] = json.RawMessage(append([]byte(nil), b...))
		return nil
	})
	return out, err
}

// fail ends a run as failed with why, its step too, and completes the job with it.
// attempts is how many attempts ran the step.
func (w *stepper) fail(ctx context.Context, j *river.Job[stepArgs], wf provision.Workflow[*modules.Runtime], step string, r run, attempts int, why string) error {
	return w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE compute.workflow_steps SET state = 'failed', attempts = greatest(attempts, $3), error = $4, finished_at = compute.compute_now()
			WHERE run_id = $1 AND n = $2 AND state IN ('pending', 'running')`, j.Args.Run, j.Args.Step, attempts, why)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			if err := w.finish(ctx, tx, wf, step, r, j.Args.Run, api.WorkflowFailed, why); err != nil {
				return err
			}
		}
		_, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j)
		return err
	})
}

// finish ends a running run in state, with its event.
func (w *stepper) finish(ctx context.Context, tx pgx.Tx, wf provision.Workflow[*modules.Runtime], step string, r run, runID, state, why string) error {
	var input json.RawMessage
	err := tx.QueryRow(ctx, `UPDATE compute.workflow_runs SET state = $2, error = $3, job_id = NULL, finished_at = compute.compute_now()
		WHERE id = $1 AND state = 'running' RETURNING input`, runID, state, why).Scan(&input)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := (Service{RT: w.rt}).onEnd(ctx, tx, &provision.RunEnd[*modules.Runtime]{RunID: runID, Workflow: wf.Name, TenantID: r.tenant, Subject: r.subject,
		Input: input, State: state, Error: why}); err != nil {
		return err
	}
	typ, more := EventSucceeded, map[string]any(nil)
	if state == api.WorkflowFailed {
		typ, more = EventFailed, map[string]any{"error": why}
	}
	return Service{RT: w.rt}.emit(ctx, tx, typ, r.tenant, runID, wf.Name, r.subject, step, more)
}
