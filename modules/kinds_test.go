package modules_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

// moduleFunc is a module whose Register is a function.
type moduleFunc struct {
	name string
	fn   func(r *modules.Registry)
}

func (m moduleFunc) Name() string { return m.name }
func (m moduleFunc) Register(r *modules.Registry) error {
	m.fn(r)
	return nil
}

func state(context.Context, postgres.Querier, string) (any, error) { return nil, nil }

func spend(context.Context, pgx.Tx, string) (modules.Admission, error) {
	return modules.Admission{}, nil
}

// TestRegistryRefusesWhatCannotWork checks each refusal of the kinds a module registers: a
// malformed or doubly claimed kind, a profile naming a driver nobody registered, a resolver of a
// type nobody registered, overlapping join credential prefixes.
func TestRegistryRefusesWhatCannotWork(t *testing.T) {
	cases := []struct {
		name string
		fn   func(r *modules.Registry)
		want string // in the error of Add or Check
	}{
		{"command kind without a dot", func(r *modules.Registry) { r.CommandKind(modules.CommandKind{Name: "reset"}) }, `command kind "reset"`},
		{"command kind twice", func(r *modules.Registry) {
			r.CommandKind(modules.CommandKind{Name: "a.b"}, modules.CommandKind{Name: "a.b"})
		}, "command kind a.b is registered twice"},
		{"desired kind without a version", func(r *modules.Registry) {
			r.DesiredKind(modules.DesiredKind{Name: "a.b", State: state})
		}, "needs a version"},
		{"desired kind twice", func(r *modules.Registry) {
			r.DesiredKind(modules.DesiredKind{Name: "a.b", Version: 1, State: state}, modules.DesiredKind{Name: "a.b", Version: 2, State: state})
		}, "desired-state kind a.b is registered twice"},
		{"event type with digits", func(r *modules.Registry) { r.EventTypes(modules.EventType{Name: "a.b2"}) }, `event type "a.b2"`},
		// The provisioning kinds are checked by provision.Catalog (its tests have each refusal);
		// these show the Registry reports its refusals, in Add and in Check.
		{"driver without a value", func(r *modules.Registry) { r.Driver(provision.Driver{Kind: "power", Name: "ipmi"}) }, "needs a kind, a name and a value"},
		{"profile of a missing driver", func(r *modules.Registry) {
			r.Driver(provision.Driver{Kind: "power", Name: "ipmi", Value: 1})
			r.Profile(provision.Profile{Name: "pxe", Drivers: map[string]string{"power": "ipmi", "boot": "pxe"}})
		}, `profile pxe uses boot driver "pxe", which no module registered`},
		{"workflow without steps", func(r *modules.Registry) { r.Workflow(provision.Workflow[*modules.Runtime]{Name: "a.b"}) }, "has no steps"},
		{"resolver of an unknown type", func(r *modules.Registry) {
			r.Resolver("nothing", func(context.Context, postgres.Querier, string) (map[string]any, error) { return nil, nil })
		}, `resource type "nothing"`},
		{"overlapping join prefixes", func(r *modules.Registry) {
			r.JoinCredentials(modules.JoinCredential{Prefix: "bcjoin_", Spend: spend}, modules.JoinCredential{Prefix: "bcjoin_x", Spend: spend})
		}, "overlaps"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := modules.NewRegistry()
			err := r.Add(moduleFunc{"m", c.fn})
			if err == nil {
				err = r.Check()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error = %v, want one saying %q", err, c.want)
			}
		})
	}
}

// TestRegistryLooksUpWhatWasRegistered is the other side: what was registered is found.
func TestRegistryLooksUpWhatWasRegistered(t *testing.T) {
	r := modules.NewRegistry()
	err := r.Add(moduleFunc{"m", func(r *modules.Registry) {
		r.ResourceTypes(iam.ResourceType{Name: "thing"})
		r.Resolver("thing", func(context.Context, postgres.Querier, string) (map[string]any, error) {
			return map[string]any{"name": "t"}, nil
		})
		r.CommandKind(modules.CommandKind{Name: "thing.poke"})
		r.DesiredKind(modules.DesiredKind{Name: "thing.state", Version: 3, State: state})
		r.EventTypes(modules.EventType{Name: "thing.poked"})
		r.Driver(provision.Driver{Kind: "power", Name: "ipmi", Value: "the ipmi driver"})
		r.Profile(provision.Profile{Name: "rack", Drivers: map[string]string{"power": "ipmi"}})
		r.JoinCredentials(modules.JoinCredential{Prefix: "thing_", Spend: spend})
		r.Workflow(provision.Workflow[*modules.Runtime]{Name: "thing.fix", Steps: []provision.Step[*modules.Runtime]{
			{Name: "fix", Run: func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) { return nil, nil }},
		}})
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.LookupCommandKind("thing.poke"); !ok {
		t.Error("command kind not found")
	}
	if ks := r.DesiredKinds(); len(ks) != 1 || ks[0].Version != 3 {
		t.Errorf("desired kinds = %+v", ks)
	}
	if !r.HasEventType("thing.poked") || r.HasEventType("thing.other") {
		t.Error("event types wrong")
	}
	if d, ok := r.LookupDriver("power", "ipmi"); !ok || d.Value != "the ipmi driver" {
		t.Errorf("driver = %+v, %v", d, ok)
	}
	if p, ok := r.LookupProfile("rack"); !ok || p.Drivers["power"] != "ipmi" {
		t.Errorf("profile = %+v, %v", p, ok)
	}
	if w, ok := r.LookupWorkflow("thing.fix"); !ok || w.Steps[0].Timeout != provision.DefaultStepTimeout {
		t.Errorf("workflow = %+v, %v: want it, its step's defaults filled", w, ok)
	}
	if names := r.WorkflowNames(); len(names) != 1 || names[0] != "thing.fix" {
		t.Errorf("workflow names = %v", names)
	}
	if _, ok := r.JoinCredentialFor("thing_abc"); !ok {
		t.Error("join credential not found by its prefix")
	}
	if _, ok := r.JoinCredentialFor("bcjoin_abc"); ok {
		t.Error("a credential of another prefix was found")
	}
	if fn, ok := r.LookupResolver("thing"); !ok || fn == nil {
		t.Error("resolver not found")
	}
}
