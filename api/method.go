package api

import (
	"encoding/json"
	"reflect"
	"strings"
)

// BasePath is where the API is served: every method is POST BasePath/{group}/{method}.
const BasePath = "/api/compute"

// MethodInfo describes one API method. The method table (Methods) is the single source that the
// HTTP handler, the in-process API, the typed client, the CLI and the MCP tools are driven by.
type MethodInfo struct {
	Group    string `json:"group"`
	Name     string `json:"name"`
	Action   string `json:"action"`   // the IAM action, compute:{group}:{name}
	Mutating bool   `json:"mutating"` // mutations make exactly one IAM decision and may carry an idempotency key
	Resource string `json:"resource"` // the IAM resource type the method acts on, e.g. compute-pool
	Phase    string `json:"phase"`    // the roadmap phase that introduced it
	Summary  string `json:"summary"`
}

// FullName is "group.name", e.g. "pools.create".
func (m MethodInfo) FullName() string { return m.Group + "." + m.Name }

// Path is the HTTP path of the method, e.g. /api/compute/pools/create.
func (m MethodInfo) Path() string { return BasePath + "/" + m.Group + "/" + m.Name }

// Method is a MethodInfo that also carries its input and output types, so that every caller is
// typed by the table itself.
type Method[In, Out any] struct {
	MethodInfo
}

// Info returns the untyped description of the method.
func (m Method[In, Out]) Info() MethodInfo { return m.MethodInfo }

// Types returns the method's input and output types.
func (m Method[In, Out]) Types() (in, out reflect.Type) {
	return reflect.TypeFor[In](), reflect.TypeFor[Out]()
}

// Describer is any Method: its description and its types.
type Describer interface {
	Info() MethodInfo
	Types() (in, out reflect.Type)
}

// Action returns the IAM action of a method: compute:{group}:{name}.
func Action(group, name string) string { return "compute:" + group + ":" + name }

// NewMethod declares a method. Modules use it to declare their own methods; the core table below
// uses it too.
func NewMethod[In, Out any](group, name string, mutating bool, resource, phase, summary string) Method[In, Out] {
	return Method[In, Out]{MethodInfo{
		Group: group, Name: name, Action: Action(group, name),
		Mutating: mutating, Resource: resource, Phase: phase, Summary: summary,
	}}
}

// ValidName reports whether s may be a group or method name: lower camel case ASCII letters and
// digits, starting with a letter.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0
}

// MethodDescription is a served method as GET BasePath/methods describes it: its MethodInfo and
// the JSON schema of its input, so that a client without the method's Go types (the CLI or the
// MCP tools, for a module's method) can still offer and call it.
type MethodDescription struct {
	MethodInfo
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
}
