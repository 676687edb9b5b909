package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
	"github.com/better-compute/compute/provision"
)

// childEnv, when set to a database URL, makes the test binary a worker process of that
// database instead of running tests (TestKilledMidStepTheRunContinuesElsewhere).
const childEnv = "BC_WORKFLOW_CHILD_DB"

func TestMain(m *testing.M) {
	if url := os.Getenv(childEnv); url != "" {
		child(url)
		return
	}
	pgtest.Main(m)
}

// flows is a module of test workflows. Each step records that it ran in compute.flowtest_effects
// (created by the test), so that a test counts runs of a step across processes.
type flows struct {
	mu        sync.Mutex
	attempts  map[string]int
	cancelled chan error // the blocking step's context error
}

func newFlows() *flows { return &flows{attempts: map[string]int{}, cancelled: make(chan error, 1)} }

func (*flows) Name() string { return "flowtest" }

func (f *flows) attempt(step string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[step]++
	return f.attempts[step]
}

func effect(ctx context.Context, s *provision.StepRun[*modules.Runtime]) error {
	_, err := s.Runtime.DB.Pool.Exec(ctx, `INSERT INTO compute.flowtest_effects (run, step, pid) VALUES ($1, $2, $3)`, s.RunID, s.Step, os.Getpid())
	return err
}

// ended records a run's end, as an OnEnd hook, in the transaction that ends it.
func ended(ctx context.Context, tx pgx.Tx, e *provision.RunEnd[*modules.Runtime]) error {
	_, err := tx.Exec(ctx, `INSERT INTO compute.flowtest_effects (run, step, pid) VALUES ($1, $2, $3)`, e.RunID, "end:"+e.State, os.Getpid())
	return err
}

func (f *flows) Register(r *modules.Registry) error {
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.three", OnEnd: ended, Steps: []provision.Step[*modules.Runtime]{
		{Name: "one", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			var in struct{ Start int }
			if err := jsonInput(s, &in); err != nil {
				return nil, provision.Permanent(err)
			}
			return map[string]int{"n": in.Start + 1}, nil
		}},
		{Name: "two", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			if f.attempt("two") == 1 {
				return nil, errors.New("the first attempt fails")
			}
			var one struct{ N int }
			if err := s.Output("one", &one); err != nil {
				return nil, err
			}
			return map[string]int{"n": one.N + 1}, nil
		}},
		{Name: "three", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			if f.attempt("three") == 1 {
				return nil, provision.Wait(20*time.Millisecond, "the test makes it wait once")
			}
			return nil, nil
		}},
	}})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.doomed", OnEnd: ended, Steps: []provision.Step[*modules.Runtime]{
		{Name: "refuse", Timeout: stepTimeout, Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			return nil, provision.Permanent(errors.New("no such machine"))
		}},
		{Name: "never", Timeout: stepTimeout, Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			panic("a step after a failed one ran")
		}},
	}})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.exhausted", Steps: []provision.Step[*modules.Runtime]{
		{Name: "flaky", MaxAttempts: 2, Timeout: stepTimeout, Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			return nil, errors.New("still broken")
		}},
	}})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.blocking", OnEnd: ended, Steps: []provision.Step[*modules.Runtime]{
		{Name: "block", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			if err := effect(ctx, s); err != nil {
				return nil, err
			}
			<-ctx.Done()
			f.cancelled <- ctx.Err()
			return nil, ctx.Err()
		}},
		{Name: "never", Timeout: stepTimeout, Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			panic("a step of a cancelled run ran")
		}},
	}})
	// test.crash's middle step blocks in the child process, which is killed there.
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.crash", Steps: []provision.Step[*modules.Runtime]{
		{Name: "first", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			return nil, effect(ctx, s)
		}},
		{Name: "slow", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			if err := effect(ctx, s); err != nil {
				return nil, err
			}
			if os.Getenv(childEnv) != "" {
				<-ctx.Done() // killed before this ends
				return nil, ctx.Err()
			}
			return "done", nil
		}},
		{Name: "last", Timeout: stepTimeout, Run: func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
			return nil, effect(ctx, s)
		}},
	}})
	return nil
}

func jsonInput(s *provision.StepRun[*modules.Runtime], out any) error {
	if len(s.Input) == 0 {
		return nil
	}
	return json.Unmarshal(s.Input, out)
}

// rescueFast lets a job lost with its process be worked again after rescueAfter.
func rescueFast(o *compute.Options) {
	o.JobRescueAfter = rescueAfter
	o.Webhooks.Timeout = time.Second
}

// rescueAfter exceeds every test step's timeout (stepTimeout) and the bookkeeping.
const (
	rescueAfter = 15 * time.Second
	stepTimeout = 4 * time.Second
)

type env struct {
	*computetest.Env
	cl *client.Client
}

func newEnv(t *testing.T, f *flows) env {
	t.Helper()
	e := computetest.New(t, computetest.Options{Modules: []compute.Module{f}, Configure: rescueFast})
	if _, err := e.DB.Pool.Exec(context.Background(), `CREATE TABLE compute.flowtest_effects (run uuid, step text, pid int, at timestamptz DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(e.Server(t), client.WithAPIKey(e.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	return env{e, cl}
}

func (e env) start(t *testing.T, workflow string, input any) string {
	t.Helper()
	var id string
	err := e.DB.Tx(context.Background(), func(tx pgx.Tx) error {
		var err error
		id, err = e.Compute.Runtime().Workflows.Start(context.Background(), tx, provision.StartWorkflow{
			Workflow: workflow, TenantID: computetest.RootTenantID, Subject: "node-1", Input: input, CreatedBy: "test"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// wait polls workflows.get until the run is no longer running.
func (e env) wait(t *testing.T, run string, within time.Duration) api.WorkflowRun {
	t.Helper()
	var r api.WorkflowRun
	computetest.Eventually(t, within, "run "+run+" finished", func() bool {
		var err error
		if r, err = e.cl.Workflows.Get(context.Background(), api.GetWorkflow{Run: run}); err != nil {
			t.Fatal(err)
		}
		return r.State != api.WorkflowRunning
	})
	return r
}

// events are the run's events, type/step, in log order, once its last is in the log.
func (e env) events(t *testing.T, run string) []string {
	t.Helper()
	var types []string
	computetest.Eventually(t, 30*time.Second, "the last event of run "+run, func() bool {
		page, err := e.cl.Events.List(context.Background(), api.ListEvents{Subject: run, PageRequest: api.PageRequest{Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		types = types[:0]
		for _, ev := range page.Items {
			types = append(types, ev.Type+"/"+ev.Data["step"].(string))
		}
		n := len(page.Items)
		return n > 0 && slices.Contains([]string{"workflow.succeeded", "workflow.failed", "workflow.cancelled"}, page.Items[n-1].Type)
	})
	return types
}

func TestARunGoesThroughItsStepsRetryingAndWaiting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newFlows())
	if err := e.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	run := e.start(t, "test.three", map[string]int{"start": 40})
	r := e.wait(t, run, 30*time.Second)
	if r.State != api.WorkflowSucceeded || r.FinishedAt == nil || r.Step != "three" {
		t.Fatalf("run = %+v, want succeeded at step three", r)
	}
	attempts := map[string]int{}
	for _, s := range r.Steps {
		if s.State != api.StepSucceeded || s.StartedAt == nil || s.FinishedAt == nil {
			t.Errorf("step %+v, want succeeded with its times", s)
		}
		attempts[s.Name] = s.Attempts
	}
	if attempts["one"] != 1 || attempts["two"] != 2 || attempts["three"] != 1 {
		t.Errorf("attempts %v, want one 1, two 2 (one retry), three 1 (a wait is no attempt)", attempts)
	}
	var out struct{ N int }
	if err := e.DB.Pool.QueryRow(context.Background(), `SELECT (output->>'n')::int FROM compute.workflow_steps WHERE run_id = $1 AND name = 'two'`, run).Scan(&out.N); err != nil || out.N != 42 {
		t.Errorf("step two's output n = %d (%v), want 42: the input and step one's output reach it", out.N, err)
	}
	want := []string{"workflow.started/one", "workflow.step_started/one", "workflow.step_succeeded/one",
		"workflow.step_started/two", "workflow.step_retrying/two", "workflow.step_succeeded/two",
		"workflow.step_started/three", "workflow.step_succeeded/three", "workflow.succeeded/three"}
	if got := e.events(t, run); !slices.Equal(got, want) {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}
	waitEffect(t, e, run, "end:succeeded", 1) // OnEnd ran, in the run's last transaction
	list, err := e.cl.Workflows.List(context.Background(), api.ListWorkflows{Workflow: "test.three", State: api.WorkflowSucceeded})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != run {
		t.Errorf("workflows.list = %+v, %v", list.Items, err)
	}
}

func TestFailedStepsFailTheRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newFlows())
	if err := e.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	doomed, exhausted := e.start(t, "test.doomed", nil), e.start(t, "test.exhausted", nil)
	r := e.wait(t, doomed, 30*time.Second)
	if r.State != api.WorkflowFailed || r.Step != "refuse" || r.Steps[0].Attempts != 1 || r.Steps[1].State != api.StepPending {
		t.Errorf("a permanent failure: %+v", r)
	}
	if r.Error == "" || !strings.Contains(r.Error, "no such machine") {
		t.Errorf("the run's error %q does not say why", r.Error)
	}
	r = e.wait(t, exhausted, 30*time.Second)
	if r.State != api.WorkflowFailed || r.Steps[0].Attempts != 2 || !strings.Contains(r.Error, "attempt 2: still broken") {
		t.Errorf("a step out of attempts: %+v", r)
	}
	waitEffect(t, e, doomed, "end:failed", 1)
	if got := e.events(t, doomed); !slices.Equal(got, []string{"workflow.started/refuse", "workflow.step_started/refuse", "workflow.failed/refuse"}) {
		t.Errorf("events of the doomed run: %v", got)
	}
	if _, err := e.cl.Workflows.Cancel(context.Background(), api.GetWorkflow{Run: doomed}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Errorf("cancel of a failed run: %v, want failed_precondition", err)
	}
}

func TestCancellingARunStopsItsStepInFlight(t *testing.T) {
	t.Parallel()
	f := newFlows()
	e := newEnv(t, f)
	if err := e.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	run := e.start(t, "test.blocking", nil)
	waitEffect(t, e, run, "block", 1)
	r, err := e.cl.Workflows.Cancel(context.Background(), api.GetWorkflow{Run: run})
	if err != nil || r.State != api.WorkflowCancelled || r.Steps[0].State != api.StepCancelled || r.Steps[1].State != api.StepCancelled {
		t.Fatalf("cancel = %+v, %v", r, err)
	}
	select {
	case err := <-f.cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the step's context ended with %v, want cancelled", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the step in flight was not stopped within 15s of the cancel")
	}
	waitEffect(t, e, run, "end:cancelled", 1)
	// A retry, were there one, would be a job of the run not finished with: once every job of the
	// run is, none can run "never" (or the cancelled step again).
	computetest.Eventually(t, 30*time.Second, "every job of the cancelled run finished with", func() bool {
		return computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.river_job WHERE kind = 'workflow.step' AND args->>'run' = $1
			AND state NOT IN ('completed', 'cancelled', 'discarded')`, run) == 0
	})
	if n := computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.river_job WHERE kind = 'workflow.step' AND args->>'run' = $1 AND (args->>'step')::int > 0`, run); n != 0 {
		t.Errorf("%d jobs for a step after the cancelled one", n)
	}
	if r, _ := e.cl.Workflows.Get(context.Background(), api.GetWorkflow{Run: run}); r.State != api.WorkflowCancelled {
		t.Errorf("after its step stopped the run is %s", r.State)
	}
	if _, err := e.cl.Workflows.Get(context.Background(), api.GetWorkflow{Run: "0190a0b0-0000-7000-8000-00000000dead"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("get of no run: %v", err)
	}
}

// waitEffect waits until step of run has run n times.
func waitEffect(t *testing.T, e env, run, step string, n int) []int {
	t.Helper()
	var pids []int
	computetest.Eventually(t, 60*time.Second, fmt.Sprintf("step %s of run %s run %d times", step, run, n), func() bool {
		rows, err := e.DB.Pool.Query(context.Background(), `SELECT pid FROM compute.flowtest_effects WHERE run = $1 AND step = $2 ORDER BY at`, run, step)
		if err != nil {
			t.Fatal(err)
		}
		if pids, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
			t.Fatal(err)
		}
		return len(pids) >= n
	})
	return pids
}

// TestKilledMidStepTheRunContinuesElsewhere runs a workflow's steps in a worker process that is
// killed (SIGKILL) in the middle of a step; this process then works the queue, and the run
// finishes: the killed step runs again, the steps before it do not, and each step is recorded as
// done once.
func TestKilledMidStepTheRunContinuesElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newFlows())
	run := e.start(t, "test.crash", nil)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+e.DB.Pool.Config().ConnString())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pids := waitEffect(t, e, run, "slow", 1)
	if pids[0] != cmd.Process.Pid {
		t.Fatalf("the slow step ran in process %d, want the child %d", pids[0], cmd.Process.Pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed := time.Now()

	if err := e.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := e.wait(t, run, 120*time.Second)
	t.Logf("the run finished %s after its worker was killed", time.Since(killed).Round(time.Second))
	if r.State != api.WorkflowSucceeded {
		t.Fatalf("run = %+v, want succeeded", r)
	}
	if got := waitEffect(t, e, run, "first", 1); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Errorf("step first ran in %v, want once, in the child", got)
	}
	if got := waitEffect(t, e, run, "slow", 2); len(got) != 2 || got[1] != os.Getpid() {
		t.Errorf("step slow ran in %v, want the child, then this process", got)
	}
	if got := waitEffect(t, e, run, "last", 1); len(got) != 1 {
		t.Errorf("step last ran %d times, want once", len(got))
	}
	if r.Steps[1].Attempts != 2 {
		t.Errorf("step slow counts %d attempts, want 2", r.Steps[1].Attempts)
	}
	want := []string{"workflow.started/first", "workflow.step_started/first", "workflow.step_succeeded/first",
		"workflow.step_started/slow", "workflow.step_succeeded/slow",
		"workflow.step_started/last", "workflow.step_succeeded/last", "workflow.succeeded/last"}
	if got := e.events(t, run); !slices.Equal(got, want) {
		t.Errorf("events\n got %v\nwant %v", got, want)
	}
}

// child is the worker process of TestKilledMidStepTheRunContinuesElsewhere: a control plane in
// the worker mode on the test's database, until it is killed.
func child(url string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "workflow child:", err)
		os.Exit(2)
	}
	db, err := postgres.Open(ctx, url)
	if err != nil {
		fail(err)
	}
	local, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: computetest.RootTenantID})
	if err != nil {
		fail(err)
	}
	c, err := compute.New(compute.Options{Database: db, Secret: computetest.Secret, BaseURL: "http://compute.test",
		RootTenantID: computetest.RootTenantID, IAM: local, Modules: []compute.Module{newFlows()}, Mode: compute.ModeWorker,
		JobRescueAfter: rescueAfter, Webhooks: compute.WebhookOptions{Timeout: time.Second}})
	if err != nil {
		fail(err)
	}
	if err := c.Initialize(ctx); err != nil {
		fail(err)
	}
	if err := c.Start(ctx); err != nil {
		fail(err)
	}
	<-ctx.Done()
}
