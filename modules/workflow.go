package modules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// Workflow is a durable procedure of named steps (a deploy, a remediation), run by the core's
// workflow engine (internal/core/workflow, docs/workflows.md): its state is in PostgreSQL, each step is
// a River job, so a run survives the death of any process and continues on another. Steps run in
// order, one at a time; a step is retried with backoff until it succeeds, fails for good or runs
// out of attempts, and a run may be cancelled. Every transition is an event.
type Workflow struct {
	Name  string // e.g. "metal.deploy"; also the event data's workflow
	Steps []Step
	// OnEnd, if set, runs in the transaction that ends a run (succeeded, failed or cancelled),
	// so that what the run was about is never left half-way: a machine whose deploy failed is
	// marked failed in the same commit. An error it returns rolls that end back, to be tried
	// again.
	OnEnd func(ctx context.Context, tx pgx.Tx, e *RunEnd) error
}

// RunEnd is a run that is ending.
type RunEnd struct {
	RunID, Workflow, TenantID, Subject string
	Input                              json.RawMessage
	State                              string // succeeded, failed or cancelled
	Error                              string // why it failed
	Runtime                            *Runtime
}

// Step is one step of a workflow. Run must be idempotent: a step whose process died before its
// completion was recorded runs again (on another process), though never twice to completion.
type Step struct {
	Name string // unique in its workflow, e.g. "power-on"
	// Run does the step's work and returns its output (JSON-encoded, kept, and handed to the
	// later steps). An error retries it after a backoff; Permanent(err) fails the run at once;
	// Wait(d, why) asks to be run again after d without counting an attempt.
	Run func(ctx context.Context, s *StepRun) (any, error)
	// Timeout bounds one attempt (its context ends). Default DefaultStepTimeout.
	Timeout time.Duration
	// MaxAttempts bounds the attempts before the run fails. Default DefaultStepAttempts.
	MaxAttempts int
	// Deadline bounds the step as a whole, waits included, from its first attempt. Default
	// DefaultStepDeadline.
	Deadline time.Duration
}

// Defaults of Step.
const (
	DefaultStepTimeout  = time.Minute
	DefaultStepAttempts = 5
	DefaultStepDeadline = 24 * time.Hour
)

// StepRun is what a step is run with.
type StepRun struct {
	RunID    string
	Workflow string
	Step     string
	TenantID string
	Subject  string // what the run is about (a node's id, a machine's)
	Attempt  int    // 1 for the first
	Input    json.RawMessage
	// Outputs are the outputs of the steps before this one, by step name.
	Outputs map[string]json.RawMessage
	Runtime *Runtime
}

// Output decodes the output of an earlier step into out.
func (s *StepRun) Output(step string, out any) error {
	b, ok := s.Outputs[step]
	if !ok {
		return fmt.Errorf("workflow %s: step %s has no output of step %q", s.Workflow, s.Step, step)
	}
	return json.Unmarshal(b, out)
}

// PermanentError fails a run without retrying its step.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a failure no retry can mend.
func Permanent(err error) error { return &PermanentError{Err: err} }

// WaitError asks for the step to run again after After, without counting an attempt: the step
// waits for something (a node to drain, a machine to boot). Why is shown on the step meanwhile.
type WaitError struct {
	After time.Duration
	Why   string
}

func (e *WaitError) Error() string { return "waiting " + e.After.String() + ": " + e.Why }

// Wait is the error a step returns to be run again after d.
func Wait(d time.Duration, why string) error { return &WaitError{After: d, Why: why} }

// IsWait reports whether err asks to wait, and for how long.
func IsWait(err error) (*WaitError, bool) {
	var w *WaitError
	ok := errors.As(err, &w)
	return w, ok
}

// Workflows starts and cancels runs of registered workflows, in a transaction: a run begins
// exactly when its transaction commits.
type Workflows interface {
	Start(ctx context.Context, tx pgx.Tx, in StartWorkflow) (runID string, err error)
	// Cancel ends a run that has not finished; a step in flight has its context cancelled.
	Cancel(ctx context.Context, tx pgx.Tx, runID string) error
}

// StartWorkflow is a run to start.
type StartWorkflow struct {
	Workflow  string // a registered workflow's name
	TenantID  string
	Subject   string
	Input     any // JSON-encoded; nil reads as {}
	CreatedBy string
}

var workflowNameRE = regexp.MustCompile(`^[a-z]+(\.[a-z_-]+)+$`)
var stepNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// Workflow registers a workflow, its steps' defaults filled.
func (r *Registry) Workflow(w Workflow) {
	if !workflowNameRE.MatchString(w.Name) {
		r.fail(fmt.Errorf("workflow %q: a name is lowercase words joined by dots, e.g. metal.deploy", w.Name))
		return
	}
	if _, dup := r.workflows[w.Name]; dup {
		r.fail(fmt.Errorf("workflow %q registered twice", w.Name))
		return
	}
	if len(w.Steps) == 0 {
		r.fail(fmt.Errorf("workflow %q has no steps", w.Name))
		return
	}
	seen := map[string]bool{}
	steps := make([]Step, len(w.Steps))
	for i, s := range w.Steps {
		switch {
		case !stepNameRE.MatchString(s.Name):
			r.fail(fmt.Errorf("workflow %q: step %q: a step name is lowercase letters, digits and '-'", w.Name, s.Name))
			return
		case seen[s.Name]:
			r.fail(fmt.Errorf("workflow %q: two steps are named %q", w.Name, s.Name))
			return
		case s.Run == nil:
			r.fail(fmt.Errorf("workflow %q: step %q has no Run", w.Name, s.Name))
			return
		case s.Timeout < 0 || s.MaxAttempts < 0 || s.Deadline < 0:
			r.fail(fmt.Errorf("workflow %q: step %q: Timeout, MaxAttempts and Deadline must not be negative", w.Name, s.Name))
			return
		}
		seen[s.Name] = true
		if s.Timeout == 0 {
			s.Timeout = DefaultStepTimeout
		}
		if s.MaxAttempts == 0 {
			s.MaxAttempts = DefaultStepAttempts
		}
		if s.Deadline == 0 {
			s.Deadline = DefaultStepDeadline
		}
		steps[i] = s
	}
	w.Steps = steps
	r.workflows[w.Name] = w
}

// LookupWorkflow returns a registered workflow.
func (r *Registry) LookupWorkflow(name string) (Workflow, bool) {
	w, ok := r.workflows[name]
	return w, ok
}

// Workflows returns the registered workflows' names.
func (r *Registry) WorkflowNames() []string {
	out := make([]string, 0, len(r.workflows))
	for n := range r.workflows {
		out = append(out, n)
	}
	return out
}
