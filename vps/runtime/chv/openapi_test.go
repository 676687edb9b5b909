package chv

// A reader of cloud-hypervisor's OpenAPI description (testdata/openapi) and a strict validator of
// JSON bodies against its schemas. Strict: a property the schema does not list is an error,
// because cloud-hypervisor's serde ignores unknown fields, so a misspelt field would silently
// fall back to a default on a real VMM.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// specPath is the vendored description, relative to the package.
const specPath = "testdata/openapi/cloud-hypervisor.yaml"

// apiSpec is the part of an OpenAPI 3.0 document the tests read.
type apiSpec struct {
	Paths      map[string]map[string]apiOperation `yaml:"paths"`
	Components struct {
		Schemas map[string]*apiSchema `yaml:"schemas"`
	} `yaml:"components"`
}

type apiOperation struct {
	RequestBody *struct {
		Required bool `yaml:"required"`
		Content  map[string]struct {
			Schema *apiSchema `yaml:"schema"`
		} `yaml:"content"`
	} `yaml:"requestBody"`
}

type apiSchema struct {
	Ref                  string                `yaml:"$ref"`
	Type                 string                `yaml:"type"`
	Format               string                `yaml:"format"`
	Required             []string              `yaml:"required"`
	Properties           map[string]*apiSchema `yaml:"properties"`
	Items                *apiSchema            `yaml:"items"`
	AdditionalProperties *apiSchema            `yaml:"additionalProperties"`
	Enum                 []any                 `yaml:"enum"`
	Minimum              *float64              `yaml:"minimum"`
	Maximum              *float64              `yaml:"maximum"`
	MinLength            *int                  `yaml:"minLength"`
}

var (
	specOnce   sync.Once
	specLoaded *apiSpec
	specErr    error
)

// loadSpec reads the description at path once per process.
func loadSpec(path string) (*apiSpec, error) {
	specOnce.Do(func() {
		data, err := os.ReadFile(path)
		if err != nil {
			specErr = err
			return
		}
		var s apiSpec
		if err := yaml.Unmarshal(data, &s); err != nil {
			specErr = fmt.Errorf("%s: %w", path, err)
			return
		}
		if len(s.Paths) == 0 || len(s.Components.Schemas) == 0 {
			specErr = fmt.Errorf("%s: no paths or schemas", path)
			return
		}
		specLoaded = &s
	})
	return specLoaded, specErr
}

// specFile is the description's absolute path, for the fake VMM that runs elsewhere.
func specFile() string {
	abs, err := filepath.Abs(specPath)
	if err != nil {
		panic(err)
	}
	return abs
}

// bodySchema is the name of the schema of op's request body (e.g. "VmConfig" for PUT
// /vm.create), "" for an operation without one; ok is false when the description has no such
// operation.
func (s *apiSpec) bodySchema(method, path string) (name string, required, ok bool) {
	ops, ok := s.Paths[path]
	if !ok {
		return "", false, false
	}
	op, ok := ops[strings.ToLower(method)]
	if !ok {
		return "", false, false
	}
	if op.RequestBody == nil {
		return "", false, true
	}
	media, ok := op.RequestBody.Content["application/json"]
	if !ok || media.Schema == nil {
		return "", op.RequestBody.Required, true
	}
	return strings.TrimPrefix(media.Schema.Ref, "#/components/schemas/"), op.RequestBody.Required, true
}

// validateJSON checks a JSON document against the named schema; it returns the violations, each
// with its JSON path.
func (s *apiSpec) validateJSON(schema string, data []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{"not JSON: " + err.Error()}
	}
	if dec.More() {
		return []string{"not one JSON document"}
	}
	var errs []string
	s.validate("$", &apiSchema{Ref: "#/components/schemas/" + schema}, v, &errs)
	return errs
}

// Ranges of the integer formats the description uses.
var intFormats = map[string][2]float64{
	"int8": {math.MinInt8, math.MaxInt8}, "int16": {math.MinInt16, math.MaxInt16},
	"int32": {math.MinInt32, math.MaxInt32}, "int64": {math.MinInt64, math.MaxInt64},
	"uint8": {0, math.MaxUint8}, "uint16": {0, math.MaxUint16}, "uint32": {0, math.MaxUint32},
}

func (s *apiSpec) validate(at string, sc *apiSchema, v any, errs *[]string) {
	fail := func(format string, args ...any) { *errs = append(*errs, at+": "+fmt.Sprintf(format, args...)) }
	if sc.Ref != "" {
		name := strings.TrimPrefix(sc.Ref, "#/components/schemas/")
		ref, ok := s.Components.Schemas[name]
		if !ok {
			fail("the description has no schema %q", name)
			return
		}
		sc = ref
	}
	if len(sc.Enum) > 0 {
		found := false
		for _, e := range sc.Enum {
			if fmt.Sprint(e) == fmt.Sprint(v) {
				found = true
			}
		}
		if !found {
			fail("%v is not one of %v", v, sc.Enum)
		}
	}
	switch sc.Type {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			fail("want an object, have %T", v)
			return
		}
		for _, req := range sc.Required {
			if _, ok := obj[req]; !ok {
				fail("required property %q is missing", req)
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := sc.Properties[k]; ok {
				s.validate(at+"."+k, p, obj[k], errs)
			} else if sc.AdditionalProperties != nil {
				s.validate(at+"."+k, sc.AdditionalProperties, obj[k], errs)
			} else {
				fail("property %q is not in the schema", k)
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			fail("want an array, have %T", v)
			return
		}
		if sc.Items != nil {
			for i, e := range arr {
				s.validate(fmt.Sprintf("%s[%d]", at, i), sc.Items, e, errs)
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			fail("want a string, have %T", v)
			return
		}
		if sc.MinLength != nil && len(str) < *sc.MinLength {
			fail("shorter than %d", *sc.MinLength)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			fail("want a boolean, have %T", v)
		}
	case "integer", "number":
		n, ok := v.(json.Number)
		if !ok {
			fail("want a number, have %T", v)
			return
		}
		f, err := n.Float64()
		if err != nil {
			fail("%s: %v", n, err)
			return
		}
		if sc.Type == "integer" {
			if _, err := n.Int64(); err != nil && !strings.HasPrefix(sc.Format, "uint") {
				fail("%s is not an integer", n)
				return
			}
			if r, ok := intFormats[sc.Format]; ok && (f < r[0] || f > r[1]) {
				fail("%s is out of %s", n, sc.Format)
			}
		}
		if sc.Minimum != nil && f < *sc.Minimum {
			fail("%s is below the minimum %v", n, *sc.Minimum)
		}
		if sc.Maximum != nil && f > *sc.Maximum {
			fail("%s is above the maximum %v", n, *sc.Maximum)
		}
	case "":
		// no type: anything
	default:
		fail("the validator does not know the type %q", sc.Type)
	}
}
