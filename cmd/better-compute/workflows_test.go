package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/provision"
)

// cliFlows is a module of two workflows for the CLI: one whose second step waits once, one whose
// step fails for good.
type cliFlows struct{ waited atomic.Bool }

func (*cliFlows) Name() string { return "clitest" }

func (f *cliFlows) Register(r *modules.Registry) error {
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.cli", Steps: []provision.Step[*modules.Runtime]{
		{Name: "first", Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) { return nil, nil }},
		{Name: "second", Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			if !f.waited.Swap(true) {
				return nil, provision.Wait(300*time.Millisecond, "the test makes it wait")
			}
			return nil, nil
		}},
	}})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: "test.cli-doomed", Steps: []provision.Step[*modules.Runtime]{
		{Name: "only", Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
			return nil, provision.Permanent(errors.New("the disk is gone"))
		}},
	}})
	return nil
}

// TestWorkflowsWatchFollowsARunToItsEnd runs better-compute workflows watch against a control
// plane over HTTP: it prints the run's progress as it changes and exits 0 when the run succeeds,
// 1 with the error when it fails.
func TestWorkflowsWatchFollowsARunToItsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{&cliFlows{}}})
	conn := connection(t, env.Server(t), env.RootKey)
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	start := func(workflow string) string {
		var id string
		err := env.DB.Tx(ctx, func(tx pgx.Tx) error {
			var err error
			id, err = env.Compute.Runtime().Workflows.Start(ctx, tx, provision.StartWorkflow{Workflow: workflow, TenantID: computetest.RootTenantID, Subject: "m1"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	var stdout, stderr bytes.Buffer
	if code := run(append(conn, "workflows", "watch", "--run", start("test.cli"), "--every", "20ms"), &stdout, &stderr); code != 0 {
		t.Fatalf("watch of a run that succeeds exited %d: %s %s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"waiting: the test makes it wait", "[##] 2/2 second           succeeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("the progress lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); !strings.HasPrefix(lines[0], "[") || len(lines) < 2 {
		t.Errorf("want a line per change, got:\n%s", out)
	}

	stdout.Reset()
	stderr.Reset()
	// The run as the argument, as workflows get takes it.
	if code := run(append(conn, "workflows", "watch", start("test.cli-doomed"), "--every", "20ms"), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "the disk is gone") {
		t.Errorf("watch of a run that fails exited %d: %s %s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(append(conn, "workflows", "watch", "--run", "nope"), &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), `"nope"`) {
		t.Errorf("a bad run id exited %d: %s", code, stderr.String())
	}
}
