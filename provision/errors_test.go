package provision_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/provision"
)

// TestStepErrorsAreFoundWrapped: the engine tells Permanent and Wait apart from a retryable
// error through any wrapping a step adds.
func TestStepErrorsAreFoundWrapped(t *testing.T) {
	t.Parallel()
	gone := errors.New("the disk is gone")
	perm := fmt.Errorf("deploy: %w", provision.Permanent(gone))
	var pe *provision.PermanentError
	if !errors.As(perm, &pe) || !errors.Is(perm, gone) || perm.Error() != "deploy: the disk is gone" {
		t.Errorf("Permanent wrapped = %v: not found as a PermanentError of its cause", perm)
	}
	wait := fmt.Errorf("boot: %w", provision.Wait(2*time.Second, "the ramdisk has not reported"))
	if w, ok := provision.IsWait(wait); !ok || w.After != 2*time.Second || w.Why != "the ramdisk has not reported" {
		t.Errorf("IsWait(%v) = %+v, %v", wait, w, ok)
	}
	if _, ok := provision.IsWait(perm); ok {
		t.Error("a permanent error reads as a wait")
	}
}

// TestOutputDecodesAnEarlierStep, and names the step whose output is missing.
func TestOutputDecodesAnEarlierStep(t *testing.T) {
	t.Parallel()
	s := &provision.StepRun[env]{Workflow: "a.b", Step: "two", Outputs: map[string]json.RawMessage{"one": json.RawMessage(`{"n":3}`)}}
	var out struct{ N int }
	if err := s.Output("one", &out); err != nil || out.N != 3 {
		t.Errorf("Output(one) = %+v, %v", out, err)
	}
	if err := s.Output("zero", &out); err == nil || !strings.Contains(err.Error(), `no output of step "zero"`) {
		t.Errorf("Output(zero) = %v, want an error naming the step", err)
	}
}
