package surface

import (
	"fmt"
	"slices"
	"strings"
)

// Changes are the differences between a snapshot and another surface.
type Changes struct {
	// Breaking are elements removed or changed: what a client or a peer of the snapshot's
	// version may depend on.
	Breaking []string
	// Added are new elements, which nothing of the snapshot's version knows of or needs.
	Added []string
}

// None reports whether the surfaces are the same.
func (c Changes) None() bool { return len(c.Breaking) == 0 && len(c.Added) == 0 }

// String lists the changes, breaking ones first.
func (c Changes) String() string {
	var b strings.Builder
	for _, s := range c.Breaking {
		b.WriteString("  breaking: " + s + "\n")
	}
	for _, s := range c.Added {
		b.WriteString("  added:    " + s + "\n")
	}
	return b.String()
}

// DiffAPI compares the API surface cur with the snapshot old. Schemas are compared by their
// structure, not by the names of the Go types: a type renamed with the same JSON is no change.
func DiffAPI(old, cur *API) Changes { return Diff(FlattenAPI(old), FlattenAPI(cur)) }

// Diff compares two flattened surfaces (element → value): an element gone or of another value
// breaks, a new one is an addition.
func Diff(old, cur map[string]string) Changes {
	var c Changes
	for k, v := range old {
		nv, ok := cur[k]
		switch {
		case !ok:
			c.Breaking = append(c.Breaking, fmt.Sprintf("%s (%s) removed", k, v))
		case nv != v:
			c.Breaking = append(c.Breaking, fmt.Sprintf("%s: %s, was %s", k, nv, v))
		}
	}
	for k, v := range cur {
		if _, ok := old[k]; !ok {
			c.Added = append(c.Added, fmt.Sprintf("%s (%s)", k, v))
		}
	}
	slices.Sort(c.Breaking)
	slices.Sort(c.Added)
	return c
}

// FlattenAPI turns an API surface into elements: the error body and codes, each method ("method pools.create": whether it
// mutates, its action and resource) and each place in its input and output JSON, by path
// ("pools.create input.labels{}": string), types resolved.
func FlattenAPI(s *API) map[string]string {
	out := map[string]string{}
	s.flatten(out, "error", s.Error, nil)
	for c, status := range s.Codes {
		out["code "+c] = fmt.Sprintf("http=%d", status)
	}
	for _, m := range s.Methods {
		out["method "+m.Name] = fmt.Sprintf("mutating=%t action=%s resource=%s", m.Mutating, m.Action, m.Resource)
		s.flatten(out, m.Name+" input", m.Input, nil)
		s.flatten(out, m.Name+" output", m.Output, nil)
	}
	return out
}

// flatten records the place path holds in sch, and the places under it; stack holds the types
// being expanded, so that a type that contains itself ends.
func (s *API) flatten(out map[string]string, path string, sch *Schema, stack []string) {
	if sch == nil {
		return // nothing recorded: no element
	}
	if sch.Ref != "" {
		name := strings.TrimPrefix(sch.Ref, "#/types/")
		if slices.Contains(stack, name) {
			out[path] = "recursive"
			return
		}
		t, ok := s.Types[name]
		if !ok {
			out[path] = "unknown type " + name
			return
		}
		s.flatten(out, path, t, append(stack, name))
		return
	}
	switch {
	case sch.Type == "":
		out[path] = "any"
	case sch.Type == "array":
		out[path] = "array"
		s.flatten(out, path+"[]", sch.Items, stack)
	case sch.Type == "object" && sch.AdditionalProperties != nil:
		out[path] = "map"
		s.flatten(out, path+"{}", sch.AdditionalProperties, stack)
	case sch.Type == "object":
		out[path] = "object"
		for name, p := range sch.Properties {
			s.flatten(out, path+"."+name, p, stack)
		}
	default:
		out[path] = strings.TrimSpace(sch.Type + " " + sch.Format)
	}
}
