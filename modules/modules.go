// Package modules is the extension contract of Better Compute: what a module (metal, vps, or the
// host's own) may register — API methods, migrations, IAM resource types and actions, background
// workers and start hooks, and the workflows, drivers and profiles of package provision — through
// a Registry, and what it may use of the core (Runtime). Modules are Go values passed in
// compute.Options, never registries filled by init.
//
// Start with Module and Registry, then Handle, which declares a method with its target and its
// run. examples/pingmodule is a whole module, both halves, in one file; docs/modules.md is the
// guide.
package modules

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

// Module is an optional part of Better Compute.
type Module interface {
	// Name identifies the module; two modules may not share it.
	Name() string
	// Register declares everything the module contributes. It runs in compute.New and must not
	// start anything or touch the network.
	Register(r *Registry) error
}

// Runtime is what a running module may use of the core: the database and the IAM port, the
// core's services as narrow interfaces (services.go), and a logger. compute.New fills every field.
type Runtime struct {
	DB     *postgres.DB
	IAM    iam.Port
	Logger *slog.Logger
	Secret string // compute.Options.Secret, for keys derived from it

	Capacity  Capacity
	Nodes     Nodes
	Fleet     Fleet
	Events    Events
	Clock     Clock
	Secrets   SecretBox
	Jobs      Jobs
	Workflows provision.Workflows
	Access    Access
	Quorum    Quorum
	// Outbound is the policy of every connection made where a tenant chose (a provider's
	// endpoint, a BMC, an image's URL): check such an address when it is set, and connect
	// through Outbound's dialer or client (docs/security.md). nil is the default policy.
	Outbound *netpolicy.Policy
	// Registry is what every module registered, checked; read it, never add to it.
	Registry *Registry
}

// Call is the context of one API call, after authentication and the IAM decision.
type Call struct {
	Principal iam.Principal
	Target    Target
	Tx        pgx.Tx // the call's one transaction
	Runtime   *Runtime
}

// Target is what a call acts on, as the IAM decision sees it.
type Target struct {
	TenantID   string // the tenant the call acts in
	ResourceID string // the IAM resource id, "*" for a collection or a resource not yet created
	// Existing is true when the target was looked up: outside the caller's tenants it then reads
	// as not found (api.NotFound(Kind, Ref)), so that a caller cannot learn what other tenants have.
	Existing bool
	Kind     string // what was looked up, e.g. "pool"
	Ref      string // how the caller named it
	// TenantPath is TenantID and its ancestors, nearest first, as IAM reported them before the
	// call's transaction began. Code inside the transaction reads it here and never asks IAM:
	// an IAM port may need a connection of the same pool, and a transaction waiting on one while
	// holding another starves the pool under load.
	TenantPath []string
}

// Lookup is what a target function may read with: the database (outside the call's transaction:
// the decision must not hold a transaction open), the caller, and the IAM port for the tenant tree.
type Lookup struct {
	Q         postgres.Querier
	Principal iam.Principal
	IAM       iam.Port
}

// TargetFunc finds the target of a call before the decision.
type TargetFunc[In any] func(ctx context.Context, l Lookup, in In) (Target, error)

// RunFunc carries out a call inside its transaction.
type RunFunc[In, Out any] func(ctx context.Context, c *Call, in In) (Out, error)

// Handler is a registered method with its types erased, for the envelope to dispatch.
type Handler struct {
	Info   api.MethodInfo
	Module string

	decode func([]byte) (any, error)
	target func(context.Context, Lookup, any) (Target, error)
	run    func(context.Context, *Call, any) (any, error)
	typeOK func(any) bool
	input  reflect.Type
	output reflect.Type
	batch  *batching
}

// InputType is the Go type of the method's input.
func (h *Handler) InputType() reflect.Type { return h.input }

// OutputType is the Go type of the method's output.
func (h *Handler) OutputType() reflect.Type { return h.output }

// Decode parses a JSON input, refusing unknown fields and trailing data.
func (h *Handler) Decode(body []byte) (any, error) { return h.decode(body) }

// Target finds what the call acts on.
func (h *Handler) Target(ctx context.Context, l Lookup, in any) (Target, error) {
	return h.target(ctx, l, in)
}

// Run carries out the call.
func (h *Handler) Run(ctx context.Context, c *Call, in any) (any, error) { return h.run(ctx, c, in) }

// Accepts reports whether in is of the method's input type.
func (h *Handler) Accepts(in any) bool { return h.typeOK(in) }

// Handle registers the implementation of method m. target may be nil: the call then acts in the
// tenant its input names (a TenantID field), or the caller's, on the collection ("*").
func Handle[In, Out any](r *Registry, m api.Method[In, Out], target TargetFunc[In], run RunFunc[In, Out]) {
	if run == nil {
		r.fail(fmt.Errorf("method %s: no implementation", m.FullName()))
		return
	}
	if target == nil {
		target = func(_ context.Context, l Lookup, in In) (Target, error) {
			return TenantTarget(l.Principal, TenantOf(in)), nil
		}
	}
	h := &Handler{
		Info: m.Info(), Module: r.module,
		decode: func(b []byte) (any, error) {
			var in In
			if err := DecodeJSON(b, &in); err != nil {
				return nil, err
			}
			return in, nil
		},
		target: func(ctx context.Context, l Lookup, in any) (Target, error) {
			return target(ctx, l, in.(In))
		},
		run: func(ctx context.Context, c *Call, in any) (any, error) {
			return run(ctx, c, in.(In))
		},
		typeOK: func(in any) bool { _, ok := in.(In); return ok },
		input:  reflect.TypeFor[In](),
		output: reflect.TypeFor[Out](),
	}
	r.addHandler(h)
}

// TenantTarget is the target of a call on a collection in tenant (the caller's when empty).
func TenantTarget(p iam.Principal, tenant string) Target {
	if tenant == "" {
		tenant = p.TenantID
	}
	return Target{TenantID: tenant, ResourceID: "*"}
}

// TenantOf returns the TenantID field of an input struct, or "" when it has none: a call acts
// in the tenant its input names, or else the caller's.
func TenantOf(in any) string {
	v := reflect.ValueOf(in)
	if v.Kind() != reflect.Struct {
		return ""
	}
	if f := v.FieldByName("TenantID"); f.IsValid() && f.Kind() == reflect.String {
		return f.String()
	}
	return ""
}

// Worker is a background routine a module runs in some process modes.
type Worker struct {
	Name  string
	Modes []string // the process modes it runs in: "api", "gateway", "worker"; "all" runs every worker
	Run   func(ctx context.Context, rt *Runtime) error
}

// JobQueue is a queue of durable jobs (River, github.com/riverqueue/river): work that must
// survive a crash and be retried, such as a webhook delivery. Modules enqueue with
// Runtime.Jobs in their caller's transaction; the worker process mode works the queue.
type JobQueue struct {
	Name       string // the River queue; jobs are enqueued to it with river.InsertOpts{Queue: Name}
	MaxWorkers int    // jobs of the queue one process works at once; default 10
	// AddWorkers adds the queue's River workers (river.AddWorker). It runs once, in
	// compute.New, with the Runtime the workers will use.
	AddWorkers func(w *river.Workers, rt *Runtime) error
	// Periodic are jobs River inserts into the queue on a schedule: once when a process becomes
	// River's leader, then every Every. Only the leader inserts them, so a fleet of worker
	// processes runs each once per period.
	Periodic []PeriodicJob
}

// PeriodicJob is a job inserted every Every: a check that must run now and then, with River's
// retries (the fleet's drift check).
type PeriodicJob struct {
	Every time.Duration
	Args  func() river.JobArgs
}

// RunsIn reports whether w runs in process mode mode.
func (w Worker) RunsIn(mode string) bool { return mode == "all" || slices.Contains(w.Modes, mode) }

// EveryMaxBackoff bounds the wait between retries of a failing Every.
const EveryMaxBackoff = 30 * time.Second

// Every runs fn now and then every d until ctx ends. A failing fn (a database restart, say) is
// retried in place after a jittered backoff that starts at the smaller of d and a second, doubles
// up to EveryMaxBackoff, and starts over after every success: an outage of a few seconds costs a
// few seconds, however many outages came before. Failures are logged (slog's default logger)
// rather than returned, so a worker built on Every is not restarted from scratch by its
// supervisor; Every returns nil when ctx ends. Under a context from ObserveTicks each round is
// reported, with its duration and error.
func Every(ctx context.Context, d time.Duration, fn func() error) error {
	return EveryOrWoken(ctx, d, nil, fn)
}

// EveryOrWoken is Every, whose round also runs as soon as the channel wake returned before the
// last round is closed: a worker woken by what it waits for (new events sequenced in this
// process) runs at once, and polls only every d for what it is not told of. wake may be nil.
func EveryOrWoken(ctx context.Context, d time.Duration, wake func() <-chan struct{}, fn func() error) error {
	first := min(d, time.Second)
	backoff := first
	t, _ := ctx.Value(ticksKey{}).(ticks)
	for {
		wait := d
		var woken <-chan struct{}
		if wake != nil {
			woken = wake() // before the round: what happens during it wakes the next
		}
		start := time.Now()
		err := fn()
		if t.observe != nil && ctx.Err() == nil {
			t.observe(t.worker, time.Since(start), err)
		}
		if err != nil && ctx.Err() == nil {
			wait = backoff/2 + time.Duration(rand.Int64N(int64(backoff/2)+1))
			slog.Default().WarnContext(ctx, "modules: periodic work failed; retrying", "error", err, "in", wait.Round(time.Millisecond))
			backoff = min(backoff*2, EveryMaxBackoff)
			woken = nil // a failure waits its backoff
		} else {
			backoff = first
		}
		select {
		case <-ctx.Done():
			return nil
		case <-woken:
		case <-time.After(wait):
		}
	}
}

// TickObserver is told of every round of Every run under a context from ObserveTicks: the
// worker's name, how long the round took and its error.
type TickObserver func(worker string, took time.Duration, err error)

type ticksKey struct{}

type ticks struct {
	worker  string
	observe TickObserver
}

// ObserveTicks returns ctx under which Every tells observe of each of its rounds, as worker's.
// The control plane runs every Worker under it, for the worker metrics.
func ObserveTicks(ctx context.Context, worker string, observe TickObserver) context.Context {
	return context.WithValue(ctx, ticksKey{}, ticks{worker, observe})
}

// TicksAs returns ctx under which the rounds of Every are observed as those of worker: a worker
// that runs several loops names each.
func TicksAs(ctx context.Context, worker string) context.Context {
	t, _ := ctx.Value(ticksKey{}).(ticks)
	t.worker = worker
	return context.WithValue(ctx, ticksKey{}, t)
}

// DecodeJSON decodes one JSON value into v, refusing unknown fields and anything after it, with
// errors that say what was wrong.
func DecodeJSON(b []byte, v any) error { return decodeStrict(b, v) }

// ErrRetry marks an error after which the whole call may safely run again in a new transaction:
// a race the database refereed (an exclusion or unique violation) that a fresh snapshot avoids.
// The envelope retries such calls a few times before answering with the underlying error.
var ErrRetry = errors.New("retry")

// Retry wraps err with ErrRetry.
func Retry(err error) error { return fmt.Errorf("%w: %w", ErrRetry, err) }
