package fleetconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"

	"github.com/better-compute/compute/api"
)

// Reasons in the details of a document's invalid_argument errors.
const (
	ReasonInvalidYAML  = "invalid_yaml"
	ReasonUnknownField = "unknown_field"
	ReasonWrongType    = "wrong_type"
)

// Parse reads a FleetConfig from YAML (or JSON) and checks it as far as it can without the
// database. Every error is an invalid_argument naming the field by its path in the document
// (spec.pools[1].labelz), or the line of a YAML syntax error.
func Parse(text string) (api.FleetConfig, error) {
	var cfg api.FleetConfig
	if err := oneDocument(text); err != nil {
		return cfg, err
	}
	// Duplicate keys are an error, as YAML says; sigs.k8s.io/yaml turns the rest into JSON.
	j, err := yaml.YAMLToJSONStrict([]byte(text))
	if err != nil {
		return cfg, yamlError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return cfg, yamlError(err)
	}
	if _, ok := tree.(map[string]any); !ok {
		return cfg, &api.Error{Code: api.CodeInvalidArgument, Message: "document: must be a FleetConfig (a YAML mapping with apiVersion, kind, metadata and spec)",
			Details: map[string]any{"field": "document", "reason": ReasonWrongType}}
	}
	// encoding/json names neither an unknown field's place nor treats names case-sensitively:
	// the shape is checked first, against the Go type, so that an error names its path.
	if err := checkShape("", tree, reflect.TypeFor[api.FleetConfig]()); err != nil {
		return cfg, err
	}
	if err := json.Unmarshal(j, &cfg); err != nil {
		return cfg, yamlError(err)
	}
	if err := api.CheckInput(cfg); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// oneDocument refuses a stream of several YAML documents: the rest would be ignored silently.
func oneDocument(text string) error {
	d := yamlv2.NewDecoder(strings.NewReader(text))
	var v any
	if err := d.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return &api.Error{Code: api.CodeInvalidArgument, Message: "document: is empty; give a FleetConfig",
				Details: map[string]any{"field": "document", "reason": ReasonInvalidYAML}}
		}
		return yamlError(err)
	}
	if err := d.Decode(&v); !errors.Is(err, io.EOF) {
		return &api.Error{Code: api.CodeInvalidArgument, Message: "document: holds more than one YAML document (---); give one FleetConfig",
			Details: map[string]any{"field": "document", "reason": ReasonInvalidYAML}}
	}
	return nil
}

func yamlError(err error) error {
	return &api.Error{Code: api.CodeInvalidArgument, Message: "document: is not valid YAML: " + strings.ReplaceAll(err.Error(), "\n", " "),
		Details: map[string]any{"field": "document", "reason": ReasonInvalidYAML}}
}

// checkShape checks that v, decoded JSON, fits type t: objects have only the fields of t (by
// their JSON names, case and all), and every value has t's kind. null stands for absent.
func checkShape(path string, v any, t reflect.Type) error {
	if v == nil {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, "an object (a mapping)", v)
		}
		fields := map[string]reflect.Type{}
		var names []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			fields[name] = f.Type
			names = append(names, name)
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return &api.Error{Code: api.CodeInvalidArgument,
					Message: fmt.Sprintf("%s: unknown field; %s has %s", join(path, k), orDocument(path), strings.Join(names, ", ")),
					Details: map[string]any{"field": join(path, k), "reason": ReasonUnknownField}}
			}
			if err := checkShape(join(path, k), obj[k], ft); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return wrongType(path, "a mapping", v)
		}
		for k, e := range obj {
			if err := checkShape(join(path, k), e, t.Elem()); err != nil {
				return err
			}
		}
	case reflect.Slice:
		list, ok := v.([]any)
		if !ok {
			return wrongType(path, "a list", v)
		}
		for i, e := range list {
			if err := checkShape(fmt.Sprintf("%s[%d]", path, i), e, t.Elem()); err != nil {
				return err
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			if b, isBool := v.(bool); isBool {
				return &api.Error{Code: api.CodeInvalidArgument,
					Message: fmt.Sprintf("%s: must be a string, got %t (YAML reads yes, no, on and off unquoted as true or false: quote the value)", path, b),
					Details: map[string]any{"field": path, "reason": ReasonWrongType}}
			}
			return wrongType(path, "a string", v)
		}
	case reflect.Int:
		n, ok := v.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			return wrongType(path, "a whole number", v)
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return wrongType(path, "true or false", v)
		}
	}
	return nil
}

func wrongType(path, want string, got any) error {
	var what string
	switch g := got.(type) {
	case map[string]any:
		what = "a mapping"
	case []any:
		what = "a list"
	case string:
		what = fmt.Sprintf("%q", g)
	default:
		what = fmt.Sprint(g)
	}
	return &api.Error{Code: api.CodeInvalidArgument, Message: fmt.Sprintf("%s: must be %s, got %s", path, want, what),
		Details: map[string]any{"field": path, "reason": ReasonWrongType}}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orDocument(path string) string {
	if path == "" {
		return "a FleetConfig"
	}
	return path
}

// Render writes cfg as YAML: fields in the order of the Go types, map keys sorted, so that one
// configuration always renders to the same bytes.
func Render(cfg api.FleetConfig) (string, error) {
	j, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	// Decoded into MapSlices, the JSON keeps its order; yaml.v2 (what sigs.k8s.io/yaml is
	// built on) then writes it in block style, escaping what YAML cannot carry raw. (The JSON
	// is not read by YAML's parser, which refuses text JSON leaves raw, such as U+007F.)
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	ordered, err := orderedValue(dec)
	if err != nil {
		return "", err
	}
	out, err := yamlv2.Marshal(ordered)
	return string(out), err
}

// orderedValue reads the next JSON value from dec, objects as yaml.v2 MapSlices in their order.
func orderedValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		var m yamlv2.MapSlice
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := orderedValue(dec)
			if err != nil {
				return nil, err
			}
			m = append(m, yamlv2.MapItem{Key: k, Value: v})
		}
		_, err := dec.Token() // }
		return m, err
	case json.Delim('['):
		l := []any{}
		for dec.More() {
			v, err := orderedValue(dec)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		_, err := dec.Token() // ]
		return l, err
	case nil:
		return nil, nil
	}
	if n, ok := tok.(json.Number); ok {
		if i, err := n.Int64(); err == nil {
			return i, nil
		}
		return n.Float64()
	}
	return tok, nil // a string or a bool
}
