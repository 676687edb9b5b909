package main

import (
	"reflect"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/vps"
)

// cliModules are the modules whose methods get commands of their own: those dev and serve run
// (metal: machines, images, leases…; vps: flavors, instances, sandboxes, networks…). A host's own
// module is reached with methods and call, from the server's table.
func cliModules() ([]compute.Module, error) {
	m, err := metal.New(metal.Options{})
	if err != nil {
		return nil, err
	}
	v, err := vps.New(vps.Options{})
	if err != nil {
		return nil, err
	}
	return []compute.Module{m, v}, nil
}

// moduleTable is the methods of cliModules, as their registry declares them: the same
// descriptions and types the server's envelope dispatches by.
func moduleTable() ([]api.Describer, error) {
	mods, err := cliModules()
	if err != nil {
		return nil, err
	}
	r := modules.NewRegistry()
	for _, m := range mods {
		if err := r.Add(m); err != nil {
			return nil, err
		}
	}
	var out []api.Describer
	for _, h := range r.Handlers() {
		out = append(out, handlerMethod{h})
	}
	return out, nil
}

// handlerMethod is a module's registered method as a Describer.
type handlerMethod struct{ h *modules.Handler }

func (m handlerMethod) Info() api.MethodInfo          { return m.h.Info }
func (m handlerMethod) Types() (in, out reflect.Type) { return m.h.InputType(), m.h.OutputType() }
