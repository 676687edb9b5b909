package provision_test

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/compute/provision"
)

// rack stands for what the engine hands each step: in a control plane, *modules.Runtime.
type rack struct{ booted map[string]bool }

// PowerDriver is what the example's module expects of a driver of kind "power".
type PowerDriver interface{ PowerOn(machine string) error }

type fakeBMC struct{}

func (fakeBMC) PowerOn(string) error { return nil }

// A module declares a workflow of steps and a profile composing its drivers; the Catalog
// (modules.Registry's, through r.Workflow, r.Driver and r.Profile) fills the steps' defaults
// and refuses what cannot work.
func Example() {
	var c provision.Catalog[*rack]
	err := c.AddWorkflow(provision.Workflow[*rack]{Name: "example.deploy", Steps: []provision.Step[*rack]{
		{Name: "power-on", Timeout: 30 * time.Second, Run: func(ctx context.Context, s *provision.StepRun[*rack]) (any, error) {
			return map[string]string{"power": "on"}, nil // kept, and handed to the later steps
		}},
		{Name: "wait-boot", Deadline: 20 * time.Minute, Run: func(ctx context.Context, s *provision.StepRun[*rack]) (any, error) {
			if !s.Runtime.booted[s.Subject] {
				return nil, provision.Wait(5*time.Second, "the machine has not booted yet")
			}
			return nil, nil
		}},
	}})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Println(c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi", Value: PowerDriver(fakeBMC{})}))
	fmt.Println(c.AddProfile(provision.Profile{Name: "pxe-ipmi", Drivers: map[string]string{"power": "ipmi", "boot": "pxe"}}))

	w, _ := c.LookupWorkflow("example.deploy")
	for _, st := range w.Steps {
		fmt.Printf("%s: timeout %s, %d attempts, deadline %s\n", st.Name, st.Timeout, st.MaxAttempts, st.Deadline)
	}
	fmt.Println(c.AddWorkflow(provision.Workflow[*rack]{Name: "example.deploy"}))
	fmt.Println(c.Check()) // the profile names a boot driver nobody added
	// Output:
	// <nil>
	// <nil>
	// power-on: timeout 30s, 5 attempts, deadline 24h0m0s
	// wait-boot: timeout 1m0s, 5 attempts, deadline 20m0s
	// workflow "example.deploy" registered twice
	// provision: profile pxe-ipmi uses boot driver "pxe", which no module registered
}
