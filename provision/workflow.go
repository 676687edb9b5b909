package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Workflow is a durable procedure of named steps (a deploy, a remediation), run by the core's
// workflow engine (docs/workflows.md): its state is in PostgreSQL, each step is a River job, so a
// run survives the death of any process and continues on another. Steps run in order, one at a
// time; a step is retried with backoff until it succeeds, fails for good or runs out of
// attempts, and a run may be cancelled. Every transition is an event. R is what the engine
// hands the steps (the control plane's *modules.Runtime).
type Workflow[R any] struct {
	Name  string // lowercase words joined by dots, e.g. "metal.deploy"; also the event data's workflow
	Steps []Step[R]
	// OnEnd, if set, runs in the transaction that ends a run (succeeded, failed or cancelled),
	// so that what the run was about is never left half-way: a machine whose deploy failed is
	// marked failed in the same commit. An error it returns rolls that end back, to be tried
	// again.
	OnEnd func(ctx context.Context, tx pgx.Tx, e *RunEnd[R]) error
}

// RunEnd is a run that is ending, as its workflow's OnEnd sees it.
type RunEnd[R any] struct {
	RunID, Workflow, TenantID, Subject string
	Input                              json.RawMessage
	State                              string // succeeded, failed or cancelled
	Error                              string // why it failed
	Runtime                            R
}

// Step is one step of a workflow. Run must be idempotent: a step whose process died before its
// completion was recorded runs again (on another process), though never twice to completion.
type Step[R any] struct {
	Name string // unique in its workflow: lowercase letters, digits and '-', e.g. "power-on"
	// Run does the step's work and returns its output (JSON-encoded, kept, and handed to the
	// later steps). An error retries it after a backoff; Permanent(err) fails the run at once;
	// Wait(d, why) asks to be run again after d without counting an attempt.
	Run func(ctx context.Context, s *StepRun[R]) (any, error)
	// Timeout bounds one attempt (its context ends). Default DefaultStepTimeout.
	Timeout time.Duration
	// MaxAttempts bounds the attempts before the run fails. Default DefaultStepAttempts.
	MaxAttempts int
	// Deadline bounds the step as a whole, waits included, from its first attempt. Default
	// DefaultStepDeadline.
	Deadline time.Duration
}

// Defaults of Step, filled in by Catalog.AddWorkflow.
const (
	DefaultStepTimeout  = time.Minute
	DefaultStepAttempts = 5
	DefaultStepDeadline = 24 * time.Hour
)

// StepRun is what a step is run with.
type StepRun[R any] struct {
	RunID    string
	Workflow string
	Step     string
	TenantID string
	Subject  string // what the run is about (a node's id, a machine's)
	Attempt  int    // 1 for the first
	Input    json.RawMessage
	// Outputs are the outputs of the steps before this one, by step name.
	Outputs map[string]json.RawMessage
	Runtime R
}

// Output decodes the output of an earlier step into out.
func (s *StepRun[R]) Output(step string, out any) error {
	b, ok := s.Outputs[step]
	if !ok {
		return fmt.Errorf("workflow %s: step %s has no output of step %q", s.Workflow, s.Step, step)
	}
	return json.Unmarshal(b, out)
}

// PermanentError fails a run without retrying its step.
type PermanentError struct{ Err error }

// Error is the underlying error's text.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a failure no retry can mend: a step returning it fails its run at once.
func Permanent(err error) error { return &PermanentError{Err: err} }

// WaitError asks for the step to run again after After, without counting an attempt: the step
// waits for something (a node to drain, a machine to boot). Why is shown on the step meanwhile.
type WaitError struct {
	After time.Duration
	Why   string
}

// Error says how long the step waits, and why.
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
// exactly when its transaction commits. The core's engine implements it
// (modules.Runtime.Workflows).
type Workflows interface {
	// Start records a run of a registered workflow in tx and queues its first step.
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
