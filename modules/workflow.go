package modules

import "github.com/better-compute/compute/provision"

// The provisioning parts of the registry (workflows, drivers, profiles) are package provision's:
// the Registry holds a provision.Catalog and forwards to it, so that a module registers them as
// it registers everything else, and provision need not import this package.

// Workflow registers a workflow (provision.Catalog.AddWorkflow), its steps' defaults filled.
func (r *Registry) Workflow(w provision.Workflow[*Runtime]) {
	if err := r.provision.AddWorkflow(w); err != nil {
		r.fail(err)
	}
}

// Driver registers drivers (provision.Catalog.AddDriver).
func (r *Registry) Driver(ds ...provision.Driver) {
	for _, d := range ds {
		if err := r.provision.AddDriver(d); err != nil {
			r.fail(err)
		}
	}
}

// Profile registers profiles (provision.Catalog.AddProfile); Check verifies that each names
// registered drivers.
func (r *Registry) Profile(ps ...provision.Profile) {
	for _, p := range ps {
		if err := r.provision.AddProfile(p); err != nil {
			r.fail(err)
		}
	}
}

// LookupWorkflow returns a registered workflow.
func (r *Registry) LookupWorkflow(name string) (provision.Workflow[*Runtime], bool) {
	return r.provision.LookupWorkflow(name)
}

// WorkflowNames returns the registered workflows' names, sorted.
func (r *Registry) WorkflowNames() []string { return r.provision.WorkflowNames() }

// LookupDriver returns the driver of a kind by name.
func (r *Registry) LookupDriver(kind, name string) (provision.Driver, bool) {
	return r.provision.LookupDriver(kind, name)
}

// DriverNames returns the names of the registered drivers of a kind, sorted.
func (r *Registry) DriverNames(kind string) []string { return r.provision.DriverNames(kind) }

// LookupProfile returns a profile by name.
func (r *Registry) LookupProfile(name string) (provision.Profile, bool) {
	return r.provision.LookupProfile(name)
}
