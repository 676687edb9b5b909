// Package provision is the public face of provisioning: the durable workflows a module
// registers (Workflow, Step, the Permanent and Wait errors a step returns), the service that
// starts and cancels their runs (Workflows), and drivers and profiles, a profile being a
// composition of drivers, one per kind (power: ipmi or redfish; boot: pxe or virtual media;
// image: streamed; later runtime and provider). Catalog holds what modules registered of them
// and refuses what cannot work. The metal module builds on it, as the core's XID remediation
// does and a host's own provisioning module may; vps registers no workflow or driver here yet.
//
// The types are generic in R, what the engine hands each step and end hook: the control plane's
// is *modules.Runtime, so a module writes provision.Workflow[*modules.Runtime] and its steps take
// a *provision.StepRun[*modules.Runtime]. That is what keeps this package below modules:
// modules.Registry holds a Catalog[*modules.Runtime] and forwards Registry.Workflow, Driver and
// Profile to it, and modules.Runtime.Workflows is a Workflows. This package imports neither
// modules (that would be a cycle) nor anything under internal/
// (TestProvisionImportsNeitherModulesNorInternal).
//
// The engine that runs the workflows is the core's (internal/core/workflow,
// docs/workflows.md): runs and steps in PostgreSQL, each step's attempts a River job, so a run
// survives the death of any process. Its API group, workflows.get, workflows.list and
// workflows.cancel, is declared in package api with the other groups (api.WorkflowsGet,
// api.WorkflowsList, api.WorkflowsCancel; the wire types api.WorkflowRun and api.WorkflowStep),
// because api is the contract clients import and the generated clients depend on it.
//
// There is no provision.New() module to pass in compute.Options.Modules, though the design
// card once named one: the engine runs in every control plane (the core's own XID remediation is
// a workflow), and a package that holds the types modules uses cannot also implement
// modules.Module without the import cycle above. The engine registers itself.
package provision
