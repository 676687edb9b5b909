package provision

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
)

// Catalog holds the workflows, drivers and profiles modules registered, and refuses what cannot
// work: a malformed name, a name taken twice, a workflow without steps, a step without Run, and
// (Check, once everything is in) a profile naming a driver nobody registered. modules.Registry
// holds the control plane's (Registry.Workflow, Driver and Profile add to it). The zero value is
// an empty catalog; it is filled before use and only read after, so it has no lock.
type Catalog[R any] struct {
	workflows map[string]Workflow[R]
	drivers   map[string]Driver // by "kind/name"
	profiles  map[string]Profile
}

var (
	workflowNameRE = regexp.MustCompile(`^[a-z]+(\.[a-z_-]+)+$`)
	stepNameRE     = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
)

// AddWorkflow adds a workflow, its steps' zero Timeout, MaxAttempts and Deadline filled with the
// defaults (DefaultStepTimeout...). It refuses a malformed name, a name already added, a
// workflow without steps, and a step that is misnamed, named twice, has no Run or a negative
// bound.
func (c *Catalog[R]) AddWorkflow(w Workflow[R]) error {
	if !workflowNameRE.MatchString(w.Name) {
		return fmt.Errorf("workflow %q: a name is lowercase words joined by dots, e.g. metal.deploy", w.Name)
	}
	if _, dup := c.workflows[w.Name]; dup {
		return fmt.Errorf("workflow %q registered twice", w.Name)
	}
	if len(w.Steps) == 0 {
		return fmt.Errorf("workflow %q has no steps", w.Name)
	}
	seen := map[string]bool{}
	steps := make([]Step[R], len(w.Steps)) // a copy: the caller's slice is left as it was
	for i, s := range w.Steps {
		switch {
		case !stepNameRE.MatchString(s.Name):
			return fmt.Errorf("workflow %q: step %q: a step name is lowercase letters, digits and '-'", w.Name, s.Name)
		case seen[s.Name]:
			return fmt.Errorf("workflow %q: two steps are named %q", w.Name, s.Name)
		case s.Run == nil:
			return fmt.Errorf("workflow %q: step %q has no Run", w.Name, s.Name)
		case s.Timeout < 0 || s.MaxAttempts < 0 || s.Deadline < 0:
			return fmt.Errorf("workflow %q: step %q: Timeout, MaxAttempts and Deadline must not be negative", w.Name, s.Name)
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
	if c.workflows == nil {
		c.workflows = map[string]Workflow[R]{}
	}
	c.workflows[w.Name] = w
	return nil
}

// AddDriver adds a driver. It refuses one without a kind, a name or a value, and a kind and name
// already added.
func (c *Catalog[R]) AddDriver(d Driver) error {
	key := d.Kind + "/" + d.Name
	if d.Kind == "" || d.Name == "" || d.Value == nil {
		return fmt.Errorf("driver %q: needs a kind, a name and a value", key)
	}
	if _, dup := c.drivers[key]; dup {
		return fmt.Errorf("driver %s is registered twice", key)
	}
	if c.drivers == nil {
		c.drivers = map[string]Driver{}
	}
	c.drivers[key] = d
	return nil
}

// AddProfile adds a profile. It refuses one without a name or drivers, and a name already added;
// whether its drivers exist is Check's to say, since they may be added after it.
func (c *Catalog[R]) AddProfile(p Profile) error {
	if p.Name == "" || len(p.Drivers) == 0 {
		return errors.New("a profile needs a name and drivers")
	}
	if _, dup := c.profiles[p.Name]; dup {
		return fmt.Errorf("profile %s is registered twice", p.Name)
	}
	if c.profiles == nil {
		c.profiles = map[string]Profile{}
	}
	p.Drivers = maps.Clone(p.Drivers) // the caller's map is the caller's
	c.profiles[p.Name] = p
	return nil
}

// Check verifies what refers to other entries: every profile's drivers are in the catalog.
func (c *Catalog[R]) Check() error {
	var errs []error
	for _, n := range c.ProfileNames() {
		p := c.profiles[n]
		for _, k := range slices.Sorted(maps.Keys(p.Drivers)) {
			if _, ok := c.drivers[k+"/"+p.Drivers[k]]; !ok {
				errs = append(errs, fmt.Errorf("provision: profile %s uses %s driver %q, which no module registered", n, k, p.Drivers[k]))
			}
		}
	}
	return errors.Join(errs...)
}

// LookupWorkflow returns a workflow by name, its steps' defaults filled.
func (c *Catalog[R]) LookupWorkflow(name string) (Workflow[R], bool) {
	w, ok := c.workflows[name]
	return w, ok
}

// WorkflowNames returns the workflows' names, sorted.
func (c *Catalog[R]) WorkflowNames() []string { return slices.Sorted(maps.Keys(c.workflows)) }

// LookupDriver returns the driver of a kind by name.
func (c *Catalog[R]) LookupDriver(kind, name string) (Driver, bool) {
	d, ok := c.drivers[kind+"/"+name]
	return d, ok
}

// DriverNames returns the names of the drivers of a kind, sorted.
func (c *Catalog[R]) DriverNames(kind string) []string {
	var names []string
	for _, d := range c.drivers {
		if d.Kind == kind {
			names = append(names, d.Name)
		}
	}
	slices.Sort(names)
	return names
}

// LookupProfile returns a profile by name.
func (c *Catalog[R]) LookupProfile(name string) (Profile, bool) {
	p, ok := c.profiles[name]
	return p, ok
}

// ProfileNames returns the profiles' names, sorted.
func (c *Catalog[R]) ProfileNames() []string { return slices.Sorted(maps.Keys(c.profiles)) }
