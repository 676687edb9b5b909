package provision_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/provision"
)

// env stands for what the engine hands steps (the control plane's *modules.Runtime).
type env struct{}

type (
	workflow = provision.Workflow[env]
	step     = provision.Step[env]
)

func run(context.Context, *provision.StepRun[env]) (any, error) { return nil, nil }

// TestCatalogRefusesWhatCannotWork checks each refusal: a malformed or doubly added workflow,
// driver or profile, a step that cannot run, and (Check) a profile naming a driver nobody added.
func TestCatalogRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		fn   func(c *provision.Catalog[env]) error
		want string // in the error of an Add, or else of Check
	}{
		{"workflow without a dot", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "deploy", Steps: []step{{Name: "a", Run: run}}})
		}, `workflow "deploy"`},
		{"workflow in capitals", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "metal.Deploy", Steps: []step{{Name: "a", Run: run}}})
		}, `workflow "metal.Deploy"`},
		{"workflow twice", func(c *provision.Catalog[env]) error {
			if err := c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "a", Run: run}}}); err != nil {
				return err
			}
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "a", Run: run}}})
		}, `workflow "a.b" registered twice`},
		{"workflow without steps", func(c *provision.Catalog[env]) error { return c.AddWorkflow(workflow{Name: "a.b"}) }, "has no steps"},
		{"a step with no name", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Run: run}}})
		}, `step ""`},
		{"two steps of a name", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "s", Run: run}, {Name: "s", Run: run}}})
		}, `two steps are named "s"`},
		{"a step without Run", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "s"}}})
		}, "has no Run"},
		{"a step named in capitals", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "Power", Run: run}}})
		}, `step "Power"`},
		{"a negative timeout", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "s", Run: run, Timeout: -1}}})
		}, "must not be negative"},
		{"a negative attempts", func(c *provision.Catalog[env]) error {
			return c.AddWorkflow(workflow{Name: "a.b", Steps: []step{{Name: "s", Run: run, MaxAttempts: -1}}})
		}, "must not be negative"},
		{"driver without a value", func(c *provision.Catalog[env]) error {
			return c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi"})
		}, "needs a kind, a name and a value"},
		{"driver without a kind", func(c *provision.Catalog[env]) error {
			return c.AddDriver(provision.Driver{Name: "ipmi", Value: 1})
		}, "needs a kind, a name and a value"},
		{"driver twice", func(c *provision.Catalog[env]) error {
			// A value that cannot be compared (a map) is found twice all the same.
			if err := c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi", Value: map[string]int{}}); err != nil {
				return err
			}
			return c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi", Value: map[string]int{}})
		}, "driver power/ipmi is registered twice"},
		{"profile without drivers", func(c *provision.Catalog[env]) error {
			return c.AddProfile(provision.Profile{Name: "pxe"})
		}, "needs a name and drivers"},
		{"profile twice", func(c *provision.Catalog[env]) error {
			p := provision.Profile{Name: "pxe", Drivers: map[string]string{"power": "ipmi"}}
			if err := c.AddProfile(p); err != nil {
				return err
			}
			return c.AddProfile(p)
		}, "profile pxe is registered twice"},
		{"profile of a missing driver", func(c *provision.Catalog[env]) error {
			if err := c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi", Value: 1}); err != nil {
				return err
			}
			return c.AddProfile(provision.Profile{Name: "pxe", Drivers: map[string]string{"power": "ipmi", "boot": "pxe"}})
		}, `profile pxe uses boot driver "pxe", which no module registered`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var cat provision.Catalog[env]
			err := c.fn(&cat)
			if err == nil {
				err = cat.Check()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// TestCatalogLooksUpWhatWasAdded is the other side: what was added is found, with the step
// defaults filled and the caller's values left as they were.
func TestCatalogLooksUpWhatWasAdded(t *testing.T) {
	t.Parallel()
	var c provision.Catalog[env]
	if _, ok := c.LookupWorkflow("a.b"); ok || len(c.WorkflowNames()) != 0 {
		t.Fatal("an empty catalog has a workflow")
	}
	steps := []step{{Name: "one", Run: run}, {Name: "two", Run: run, Timeout: 5, MaxAttempts: 2, Deadline: 7}}
	for _, name := range []string{"z.last", "a.first"} {
		if err := c.AddWorkflow(workflow{Name: name, Steps: steps}); err != nil {
			t.Fatal(err)
		}
	}
	if steps[0].Timeout != 0 {
		t.Error("AddWorkflow changed the caller's steps")
	}
	w, ok := c.LookupWorkflow("a.first")
	if !ok {
		t.Fatal("workflow not found")
	}
	one, two := w.Steps[0], w.Steps[1]
	if one.Timeout != provision.DefaultStepTimeout || one.MaxAttempts != provision.DefaultStepAttempts || one.Deadline != provision.DefaultStepDeadline {
		t.Errorf("step one = %+v, want the defaults", one)
	}
	if two.Timeout != 5 || two.MaxAttempts != 2 || two.Deadline != 7 {
		t.Errorf("step two = %+v, want its own bounds", two)
	}
	if got := c.WorkflowNames(); !slices.Equal(got, []string{"a.first", "z.last"}) {
		t.Errorf("workflow names = %v", got)
	}

	if err := c.AddDriver(provision.Driver{Kind: "power", Name: "ipmi", Value: "the ipmi driver"}); err != nil {
		t.Fatal(err)
	}
	drivers := map[string]string{"power": "ipmi"}
	if err := c.AddProfile(provision.Profile{Name: "rack", Drivers: drivers}); err != nil {
		t.Fatal(err)
	}
	drivers["boot"] = "pxe" // after the fact: the catalog kept its own copy
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.LookupDriver("power", "ipmi"); !ok || d.Value != "the ipmi driver" {
		t.Errorf("driver = %+v, %v", d, ok)
	}
	if _, ok := c.LookupDriver("boot", "ipmi"); ok {
		t.Error("a driver was found under another kind")
	}
	for _, d := range []provision.Driver{{Kind: "power", Name: "redfish", Value: 1}, {Kind: "boot", Name: "pxe", Value: 2}} {
		if err := c.AddDriver(d); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.DriverNames("power"); !slices.Equal(got, []string{"ipmi", "redfish"}) {
		t.Errorf("power drivers = %v, want ipmi and redfish", got)
	}
	if got := c.DriverNames("image"); len(got) != 0 {
		t.Errorf("image drivers = %v, want none", got)
	}
	if p, ok := c.LookupProfile("rack"); !ok || len(p.Drivers) != 1 || p.Drivers["power"] != "ipmi" {
		t.Errorf("profile = %+v, %v", p, ok)
	}
	if got := c.ProfileNames(); !slices.Equal(got, []string{"rack"}) {
		t.Errorf("profile names = %v", got)
	}
}
