package modules

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

// Registry collects what modules contribute. compute.New fills one from the core and
// Options.Modules, then checks it.
type Registry struct {
	module     string // the module whose Register is running
	registered map[string]bool

	handlers   map[string]*Handler
	order      []*Handler
	types      map[string]iam.ResourceType
	actions    map[string]iam.Action
	migrations []postgres.MigrationSet
	workers    []Worker
	jobQueues  []JobQueue
	starts     []namedStart
	errs       []error

	commands  map[string]*CommandKind
	desired   []DesiredKind
	resolvers map[string]ResolveFunc
	events    map[string]string // event type → the module that registered it
	eventInfo []EventType
	provision provision.Catalog[*Runtime] // workflows, drivers, profiles
	joins     []JoinCredential
	reports   map[string]*ReportKind
}

type namedStart struct {
	module string
	fn     func(context.Context, *Runtime) error
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		registered: map[string]bool{},
		handlers:   map[string]*Handler{},
		types:      map[string]iam.ResourceType{},
		actions:    map[string]iam.Action{},
		commands:   map[string]*CommandKind{},
		resolvers:  map[string]ResolveFunc{},
		events:     map[string]string{},
		reports:    map[string]*ReportKind{},
	}
}

// Add registers a module: it refuses a nil module, an empty name and a module (or a name)
// registered twice.
func (r *Registry) Add(m Module) error {
	if m == nil {
		return errors.New("modules: a nil module")
	}
	name := m.Name()
	if name == "" {
		return fmt.Errorf("modules: module %T has an empty name", m)
	}
	if r.registered[name] {
		return fmt.Errorf("modules: module %q is registered twice", name)
	}
	r.registered[name] = true
	r.module = name
	defer func() { r.module = "" }()
	if err := m.Register(r); err != nil {
		return fmt.Errorf("modules: module %q: %w", name, err)
	}
	if err := errors.Join(r.errs...); err != nil {
		r.errs = nil
		return fmt.Errorf("modules: module %q: %w", name, err)
	}
	return nil
}

func (r *Registry) fail(err error) { r.errs = append(r.errs, err) }

func (r *Registry) addHandler(h *Handler) {
	name := h.Info.FullName()
	if !api.ValidName(h.Info.Group) || !api.ValidName(h.Info.Name) {
		r.fail(fmt.Errorf("method %q: group and name must be lowerCamelCase letters and digits", name))
		return
	}
	if prev, ok := r.handlers[name]; ok {
		r.fail(fmt.Errorf("method %s is already claimed by module %q", name, prev.Module))
		return
	}
	r.handlers[name] = h
	r.order = append(r.order, h)
}

// ResourceTypes adds IAM resource types to the catalog.
func (r *Registry) ResourceTypes(ts ...iam.ResourceType) {
	for _, t := range ts {
		if _, dup := r.types[t.Name]; dup {
			r.fail(fmt.Errorf("resource type %s is registered twice", t.Name))
			continue
		}
		r.types[t.Name] = t
	}
}

// Actions adds IAM actions to the catalog. Every method's action must be among them.
func (r *Registry) Actions(as ...iam.Action) {
	for _, a := range as {
		if _, dup := r.actions[a.Name]; dup {
			r.fail(fmt.Errorf("action %s is registered twice", a.Name))
			continue
		}
		r.actions[a.Name] = a
	}
}

// Migrations adds migration sets, applied in the order registered.
func (r *Registry) Migrations(sets ...postgres.MigrationSet) {
	r.migrations = append(r.migrations, sets...)
}

// Worker adds a background routine.
func (r *Registry) Worker(w Worker) {
	if w.Name == "" || w.Run == nil {
		r.fail(errors.New("a worker needs a name and a Run function"))
		return
	}
	r.workers = append(r.workers, w)
}

// JobQueue adds a queue of durable jobs (River) and its workers.
func (r *Registry) JobQueue(q JobQueue) {
	if q.Name == "" || q.AddWorkers == nil {
		r.fail(errors.New("a job queue needs a name and an AddWorkers function"))
		return
	}
	for _, p := range q.Periodic {
		if p.Every <= 0 || p.Args == nil {
			r.fail(fmt.Errorf("job queue %q: a periodic job needs a positive Every and an Args function", q.Name))
			return
		}
	}
	for _, o := range r.jobQueues {
		if o.Name == q.Name {
			r.fail(fmt.Errorf("job queue %q registered twice", q.Name))
			return
		}
	}
	r.jobQueues = append(r.jobQueues, q)
}

// JobQueues returns the registered job queues.
func (r *Registry) JobQueues() []JobQueue { return r.jobQueues }

// OnInitialize adds a hook run by compute.Initialize after migrations and the catalog.
func (r *Registry) OnInitialize(fn func(context.Context, *Runtime) error) {
	r.starts = append(r.starts, namedStart{r.module, fn})
}

// Check verifies the registry as a whole: every method's action is in the catalog, on a
// registered resource type, and every action names a registered type.
func (r *Registry) Check() error {
	var errs []error
	for _, a := range r.sortedActions() {
		if _, ok := r.types[a.ResourceType]; !ok {
			errs = append(errs, fmt.Errorf("modules: action %s is on resource type %q, which no module registered", a.Name, a.ResourceType))
		}
	}
	for _, h := range r.order {
		a, ok := r.actions[h.Info.Action]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("modules: method %s (module %q) uses IAM action %s, which is not in the catalog", h.Info.FullName(), h.Module, h.Info.Action))
		case a.ResourceType != h.Info.Resource:
			errs = append(errs, fmt.Errorf("modules: method %s acts on %s but its action %s is on %s", h.Info.FullName(), h.Info.Resource, a.Name, a.ResourceType))
		}
	}
	if err := postgres.CheckSets(r.migrations); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, r.checkKinds()...)
	if err := r.provision.Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Lookup returns the handler of group.name.
func (r *Registry) Lookup(group, name string) (*Handler, bool) {
	h, ok := r.handlers[group+"."+name]
	return h, ok
}

// Handlers returns every registered method, in registration order.
func (r *Registry) Handlers() []*Handler { return r.order }

// Catalog returns what the modules contribute to IAM's catalog.
func (r *Registry) Catalog() iam.Catalog {
	c := iam.Catalog{Actions: r.sortedActions()}
	for _, t := range r.types {
		c.ResourceTypes = append(c.ResourceTypes, t)
	}
	sort.Slice(c.ResourceTypes, func(i, j int) bool { return c.ResourceTypes[i].Name < c.ResourceTypes[j].Name })
	return c
}

func (r *Registry) sortedActions() []iam.Action {
	out := make([]iam.Action, 0, len(r.actions))
	for _, a := range r.actions {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// MigrationSets returns the registered migration sets, in order.
func (r *Registry) MigrationSets() []postgres.MigrationSet { return r.migrations }

// Workers returns the registered background routines.
func (r *Registry) Workers() []Worker { return r.workers }

// RunInitialize runs the OnInitialize hooks in registration order.
func (r *Registry) RunInitialize(ctx context.Context, rt *Runtime) error {
	for _, s := range r.starts {
		if err := s.fn(ctx, rt); err != nil {
			return fmt.Errorf("module %q: initialize: %w", s.module, err)
		}
	}
	return nil
}

// ActionsFor returns the catalog entries of methods: an action per method, on its resource type.
// A module that owns its methods' actions registers them with it.
func ActionsFor(methods ...api.MethodInfo) []iam.Action {
	out := make([]iam.Action, len(methods))
	for i, m := range methods {
		out[i] = iam.Action{Name: m.Action, ResourceType: m.Resource, Description: m.Summary}
	}
	return out
}
