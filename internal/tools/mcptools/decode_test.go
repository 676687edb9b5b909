package mcptools_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/tools/mcptools"
	"github.com/better-compute/compute/modules"
)

// jsonNames are the top-level JSON names a decoder fills in t, through embedded structs.
func jsonNames(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && f.Type.Kind() == reflect.Struct && name == "" {
			out = append(out, jsonNames(f.Type)...)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// known: encoding/json matches names without regard to case, and so does the API's decoder.
func known(names []string, key string) bool {
	for _, n := range names {
		if strings.EqualFold(n, key) {
			return true
		}
	}
	return false
}

// FuzzDecodeArguments checks, for every method's input type, that a tool's arguments are never
// silently dropped: arguments with a name the input lacks are refused as invalid_argument (and a
// refusal for an unknown field names one of them); accepted arguments have only known names and
// survive a round trip through the strict decoder.
func FuzzDecodeArguments(f *testing.F) {
	for _, s := range []string{``, `null`, `{}`, `[]`, `7`, `{"name":"h100"}`, `{"nme":"h100"}`, `{"NAME":"h100"}`,
		`{"pool":7}`, `{"pool":"a"} {}`, `{"pool":"gpu","gpus":8,"gpu":8}`, `{"labels":{"a":"b"},"labls":{}}`,
		`{"start":"2030-01-02T15:04:05Z"}`, `{"start":"yesterday"}`, `{"gpus":1e400}`, `{"name":"\u0000"}`, `{"a":1,"a":2}`} {
		for _, i := range []int{0, 7, 20, 30} {
			f.Add(uint8(i), []byte(s))
		}
	}
	table := api.Table()
	f.Fuzz(func(t *testing.T, which uint8, args []byte) {
		d := table[int(which)%len(table)]
		in, _ := d.Types()
		v, bad := mcptools.DecodeArguments(in, args)
		names := jsonNames(in)
		var obj map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(args))
		isObject := dec.Decode(&obj) == nil && obj != nil // the first value; trailing data is refused on its own
		var unknown []string
		for k := range obj {
			if !known(names, k) {
				unknown = append(unknown, k)
			}
		}
		if bad != nil {
			if bad.Code != api.CodeInvalidArgument {
				t.Fatalf("%s %q: %v, want invalid_argument", d.Info().FullName(), args, bad)
			}
			if bad.Details["reason"] == modules.ReasonUnknownField {
				if field, _ := bad.Details["field"].(string); !isObject || !known(unknown, field) {
					t.Fatalf("%s %q: refused the field %q, which the input has", d.Info().FullName(), args, field)
				}
			}
			return
		}
		if isObject && len(unknown) > 0 {
			t.Fatalf("%s %q: accepted, dropping %v", d.Info().FullName(), args, unknown)
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, bad := mcptools.DecodeArguments(in, again); bad != nil {
			t.Fatalf("%s: %q decoded to %s, which does not decode: %v", d.Info().FullName(), args, again, bad)
		}
	})
}

// TestToolsRefuseUnknownArguments: a misspelt argument is a tool error naming it, and nothing is
// called.
func TestToolsRefuseUnknownArguments(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	cs := session(t, env.Server(t), env.RootKey)
	cases := []struct {
		tool  string
		args  map[string]any
		field string
	}{
		{"pools_create", map[string]any{"name": "h100", "descripton": "eight H100s"}, "descripton"},
		{"pools_create", map[string]any{"name": "h100", "labels": map[string]any{"a": "b"}, "site_id": "x"}, "site_id"},
		{"reservations_create", map[string]any{"pool": "h100", "gpus": 8, "gpu": 8}, "gpu"},
		{"pools_get", map[string]any{"pool": 7}, "pool"},
	}
	for _, c := range cases {
		r := call(t, cs, c.tool, c.args)
		b, _ := json.Marshal(r.StructuredContent)
		var out struct {
			Error api.Error `json:"error"`
		}
		json.Unmarshal(b, &out)
		if !r.IsError || out.Error.Code != api.CodeInvalidArgument || out.Error.Details["field"] != c.field || !strings.Contains(text(r), c.field) {
			t.Errorf("%s %v = %s, want invalid_argument naming %s", c.tool, c.args, text(r), c.field)
		}
	}
	var pools int
	env.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM compute.pools`).Scan(&pools)
	if pools != 0 {
		t.Fatalf("%d pools made from refused arguments", pools)
	}
}
