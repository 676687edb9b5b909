// Package surface records what clients and nodes depend on, so that a change that would break
// them cannot land unnoticed: the API's surface (every served method, whether it mutates, its
// IAM action and resource, and the JSON schemas of its input and output, snapshot in
// api/surface.json) and the node protocol's (agent/v1's messages, fields, numbers and RPCs,
// snapshot in agent/v1/surface.txt). Diff tells additions, which need only the snapshot
// refreshed, from breaking changes, which need a new api.Version or agentv1.ProtocolVersion.
// `go run ./internal/tools/cmd/surface` writes the snapshots; TestAPISurface and
// TestProtocolSurface check them (docs/compatibility.md).
package surface

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/vps"
)

// APIPath and ProtocolPath are where the snapshots live, from the module's root.
const (
	APIPath      = "api/surface.json"
	ProtocolPath = "agent/v1/surface.txt"
)

// API is the API's surface: api/surface.json.
type API struct {
	// Version is api.Version when the snapshot was taken.
	Version int      `json:"version"`
	Methods []Method `json:"methods"`
	// Error is the schema of an error's body, {"error": {"code", "message", "details"}}, and
	// Codes its codes with the HTTP status of each.
	Error *Schema        `json:"error"`
	Codes map[string]int `json:"codes"`
	// Types are the JSON schemas of the named Go types methods take and return, by Go name
	// (api.Site, api.Page[api.Site], metal.Machine); a schema refers to them as
	// {"$ref": "#/types/<name>"}.
	Types map[string]*Schema `json:"types"`
}

// Method is one served method.
type Method struct {
	Name     string  `json:"name"` // group.method
	Mutating bool    `json:"mutating"`
	Action   string  `json:"action"`
	Resource string  `json:"resource"`
	Module   string  `json:"module"` // which registered it; moving it is not a change
	Input    *Schema `json:"input"`
	Output   *Schema `json:"output"`
}

// Schema is the part of JSON Schema the API's Go types need. Every field of an input may be
// left out (it is then its zero value, which the method's validation judges), so none is listed
// as required.
type Schema struct {
	Ref                  string             `json:"$ref,omitempty"`
	Type                 string             `json:"type,omitempty"`
	Format               string             `json:"format,omitempty"`
	Items                *Schema            `json:"items,omitempty"`
	Properties           map[string]*Schema `json:"properties,omitempty"`
	AdditionalProperties *Schema            `json:"additionalProperties,omitempty"`
}

// Modules are the modules whose methods are part of the surface: those this repository ships and
// better-compute serve runs. A module a host writes has its own surface.
func Modules() ([]compute.Module, error) {
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

// LiveAPI is the surface of the code as built.
func LiveAPI() (*API, error) {
	mods, err := Modules()
	if err != nil {
		return nil, err
	}
	hs, err := compute.Handlers(mods...)
	if err != nil {
		return nil, err
	}
	s := &API{Version: api.Version, Types: map[string]*Schema{}, Codes: map[string]int{}}
	body, err := s.schema(reflect.TypeFor[struct {
		Error api.Error `json:"error"`
	}]())
	if err != nil {
		return nil, fmt.Errorf("surface: the error body: %w", err)
	}
	s.Error = body
	for _, c := range api.Codes {
		s.Codes[string(c)] = c.HTTPStatus()
	}
	for _, h := range hs {
		in, err := s.schema(h.InputType())
		if err != nil {
			return nil, fmt.Errorf("surface: %s's input: %w", h.Info.FullName(), err)
		}
		out, err := s.schema(h.OutputType())
		if err != nil {
			return nil, fmt.Errorf("surface: %s's output: %w", h.Info.FullName(), err)
		}
		s.Methods = append(s.Methods, Method{Name: h.Info.FullName(), Mutating: h.Info.Mutating, Action: h.Info.Action,
			Resource: h.Info.Resource, Module: h.Module, Input: in, Output: out})
	}
	return s, nil
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// schema is the JSON schema of t as encoding/json writes and reads it; a named struct is
// recorded in s.Types once and referred to.
func (s *API) schema(t reflect.Type) (*Schema, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem() // null or the value
	}
	switch {
	case t == timeType:
		return &Schema{Type: "string", Format: "date-time"}, nil
	case t == rawType:
		return &Schema{}, nil // any JSON
	}
	if t.Implements(reflect.TypeFor[json.Marshaler]()) || reflect.PointerTo(t).Implements(reflect.TypeFor[json.Unmarshaler]()) {
		return nil, fmt.Errorf("%s marshals itself: teach surface its JSON", t)
	}
	switch t.Kind() {
	case reflect.String:
		return &Schema{Type: "string"}, nil
	case reflect.Bool:
		return &Schema{Type: "boolean"}, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return &Schema{Type: "integer"}, nil
	case reflect.Float32, reflect.Float64:
		return &Schema{Type: "number"}, nil
	case reflect.Interface:
		return &Schema{}, nil
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return &Schema{Type: "string", Format: "byte"}, nil // base64
		}
		items, err := s.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return &Schema{Type: "array", Items: items}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("%s: a map's keys must be strings", t)
		}
		v, err := s.schema(t.Elem())
		if err != nil {
			return nil, err
		}
		return &Schema{Type: "object", AdditionalProperties: v}, nil
	case reflect.Struct:
		if t.Name() == "" {
			return s.object(t)
		}
		name := typeName(t)
		if _, ok := s.Types[name]; !ok {
			s.Types[name] = nil // taken: a type that refers to itself refers, not recurses
			o, err := s.object(t)
			if err != nil {
				return nil, err
			}
			s.Types[name] = o
		}
		return &Schema{Ref: "#/types/" + name}, nil
	}
	return nil, fmt.Errorf("%s: no JSON for a %s", t, t.Kind())
}

// object is a struct's schema: its fields as encoding/json names them, those of embedded structs
// without a name of their own promoted.
func (s *API) object(t reflect.Type) (*Schema, error) {
	o := &Schema{Type: "object", Properties: map[string]*Schema{}}
	if err := s.fields(t, o); err != nil {
		return nil, err
	}
	return o, nil
}

func (s *API) fields(t reflect.Type, o *Schema) error {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(","+opts+",", ",string,") {
			return fmt.Errorf("%s.%s: the ,string option: teach surface its JSON", t, f.Name)
		}
		ft := f.Type
		if f.Anonymous && name == "" {
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if err := s.fields(ft, o); err != nil {
					return err
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fs, err := s.schema(f.Type)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", t, f.Name, err)
		}
		o.Properties[name] = fs
	}
	return nil
}

// typeName is a Go type's name as the snapshot records it: package.Name, the module's path left
// out of type arguments (api.Page[api.Site]).
func typeName(t reflect.Type) string {
	return strings.ReplaceAll(t.String(), "github.com/better-compute/compute/", "")
}
