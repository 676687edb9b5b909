package main

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestExitCodesAndOutputs runs the CLI in-process against a real control plane: each mistake in a
// command line exits 2 and says what was wrong, an API error exits 1, and with -o json every
// error is the API's envelope on stderr while stdout holds only answers.
func TestExitCodesAndOutputs(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	conn := connection(t, env.Server(t), env.RootKey)

	type envelope struct {
		Error *api.Error `json:"error"`
	}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string // a substring; "" means stdout must be empty
		stderr string // a substring; "" means stderr must be empty
		// with -o json: the envelope's code and details.field ("" for none)
		jsonCode  api.Code
		jsonField string
	}{
		{name: "success", args: []string{"pools", "list"}, code: 0, stdout: "(none)"},
		{name: "success as JSON", args: []string{"pools", "list", "-o", "json"}, code: 0, stdout: `"items"`},
		{name: "a group alone shows its help", args: []string{"pools"}, code: 0, stdout: "Available Commands"},
		{name: "unknown command", args: []string{"poolz", "list"}, code: 2, stderr: `unknown command "poolz" for "better-compute"; did you mean pools?`},
		{name: "unknown subcommand", args: []string{"pools", "lst"}, code: 2, stderr: `unknown command "lst" for "better-compute pools"; did you mean`},
		{name: "unknown subcommand as JSON", args: []string{"-o", "json", "reservations", "craete"}, code: 2, jsonCode: api.CodeInvalidArgument},
		{name: "an API error as YAML", args: []string{"pools", "get", "nope", "-o", "yaml"}, code: 1, stderr: "error:\n  code: not_found\n  message: pool \"nope\" not found\n"},
		{name: "unknown iam subcommand", args: []string{"iam", "tenant", "bogus"}, code: 2, stderr: `unknown command "bogus"`},
		{name: "unknown completion shell", args: []string{"completion", "bsh"}, code: 2, stderr: `unknown command "bsh"`},
		{name: "unknown help topic", args: []string{"help", "nope"}, code: 2, stderr: `unknown help topic "nope"`},
		{name: "help of a command", args: []string{"help", "pools", "list"}, code: 0, stdout: "List the pools"},
		{name: "unknown flag", args: []string{"pools", "list", "--bogus"}, code: 2, stderr: "unknown flag: --bogus"},
		{name: "bad flag value", args: []string{"pools", "list", "--limit", "many"}, code: 2, stderr: "--limit"},
		{name: "bad output format", args: []string{"pools", "list", "-o", "xml"}, code: 2, stderr: `-o "xml": use table, wide, json, yaml`},
		{name: "success as YAML", args: []string{"pools", "list", "-o", "yaml"}, code: 0, stdout: "items: []"},
		{name: "an extra argument", args: []string{"pools", "get", "a", "b"}, code: 2, stderr: "accepts at most 1 arg"},
		{name: "an argument to a method without one", args: []string{"pools", "list", "gpu"}, code: 2, stderr: "takes no argument"},
		{name: "a missing resource", args: []string{"pools", "get"}, code: 2, stderr: "pools get needs a pool: better-compute pools get POOL (or --pool)"},
		{name: "a missing resource as JSON", args: []string{"reservations", "release", "-o", "json"}, code: 2, jsonCode: api.CodeInvalidArgument},
		{name: "no arguments for a command without any", args: []string{"mcp", "extra"}, code: 2, stderr: "unknown command"},
		{name: "--json with an unknown field", args: []string{"pools", "create", "--json", `{"name":"h100","descripton":"x"}`}, code: 2, stderr: "unknown field \"descripton\"\n  field: descripton"},
		{name: "--json with an unknown field as JSON", args: []string{"reservations", "create", "--json", `{"pool":"gpu","gpu":8}`, "-o", "json"}, code: 2, jsonCode: api.CodeInvalidArgument, jsonField: "gpu"},
		{name: "--json with a wrong type", args: []string{"pools", "get", "--json", `{"pool":7}`}, code: 2, stderr: "field: pool"},
		{name: "--json with trailing data", args: []string{"pools", "list", "--json", `{} {}`}, code: 2, stderr: "after its JSON value"},
		{name: "--json that is not JSON", args: []string{"pools", "list", "--json", `{`}, code: 2, stderr: "not valid JSON"},
		{name: "an API error", args: []string{"pools", "get", "nope"}, code: 1, stderr: `not_found: pool "nope" not found`},
		{name: "an API error as JSON", args: []string{"pools", "get", "nope", "-o", "json"}, code: 1, jsonCode: api.CodeNotFound},
		{name: "a bad input the API refuses", args: []string{"reservations", "create", "--pool", "gpu", "--gpus", "-3", "-o", "json"}, code: 1, jsonCode: api.CodeInvalidArgument, jsonField: "gpus"},
		{name: "a wrong key", args: []string{"pools", "list", "--api-key", "biam_key_wrong"}, code: 1, stderr: "better-compute: unauthenticated: malformed token"},
		{name: "no answer", args: []string{"pools", "list", "--server", "http://127.0.0.1:1", "-o", "json"}, code: 1, jsonCode: api.CodeUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append(conn, c.args...), &stdout, &stderr)
			if code != c.code {
				t.Fatalf("better-compute %s exited %d, want %d\nstdout: %s\nstderr: %s", strings.Join(c.args, " "), code, c.code, &stdout, &stderr)
			}
			check := func(what, got, want string) {
				if want == "" && got != "" || !strings.Contains(got, want) {
					t.Errorf("better-compute %s: %s = %q, want %q", strings.Join(c.args, " "), what, got, want)
				}
			}
			if c.jsonCode == "" {
				check("stdout", stdout.String(), c.stdout)
				check("stderr", stderr.String(), c.stderr)
				for _, code := range []api.Code{api.CodeInvalidArgument, api.CodeUnauthenticated, api.CodePermissionDenied, api.CodeNotFound,
					api.CodeConflict, api.CodeQuotaExceeded, api.CodeFailedPrecondition, api.CodeConfirmationRequired, api.CodeUnavailable, api.CodeInternal} {
					if twice := string(code) + ": " + string(code) + ":"; strings.Contains(stderr.String(), twice) {
						t.Errorf("better-compute %s: stderr says %s twice: %q", strings.Join(c.args, " "), code, &stderr)
					}
				}
				return
			}
			check("stdout", stdout.String(), "")
			var e envelope
			dec := json.NewDecoder(&stderr)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&e); err != nil || e.Error == nil || dec.More() {
				t.Fatalf("stderr is not one error envelope: %v\n%s", err, &stderr)
			}
			field, _ := e.Error.Details["field"].(string)
			if e.Error.Code != c.jsonCode || e.Error.Message == "" || field != c.jsonField {
				t.Fatalf("envelope = %+v, want code %s, field %q", e.Error, c.jsonCode, c.jsonField)
			}
		})
	}
	// Nothing a refused command line asked for was made.
	var pools int
	env.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM compute.pools`).Scan(&pools)
	if pools != 0 {
		t.Fatalf("%d pools made by refused command lines", pools)
	}
}

// TestPositionalResourcesAreRequired: the CLI refuses a method whose resource argument is missing
// as a usage error without asking the API; that is right only while every such method requires it.
func TestPositionalResourcesAreRequired(t *testing.T) {
	t.Parallel()
	mods, err := moduleTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range append(api.Table(), mods...) {
		info := d.Info()
		in, _ := d.Types()
		pf := positionalField(info, in)
		if pf == "" {
			continue
		}
		val, ok := reflect.New(in).Elem().Interface().(interface{ Validate() error })
		if !ok {
			t.Errorf("%s takes its %s as the argument but has no input check", info.FullName(), pf)
			continue
		}
		f, _ := in.FieldByName(pf)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		var ae *api.Error
		err := val.Validate()
		if ae, ok = err.(*api.Error); !ok || ae.Details["field"] != name {
			t.Errorf("%s with no %s: %v, want an error naming %s", info.FullName(), name, err, name)
		}
	}
}

// FuzzDecodeInput checks --json for every method: input with a name the method's input lacks is
// a usage error (never silently dropped), an unknown field it names is one of those, and what
// is accepted survives a round trip.
func FuzzDecodeInput(f *testing.F) {
	for _, s := range []string{``, `{}`, `null`, `[]`, `{"name":"h100"}`, `{"nme":"h100"}`, `{"Name":"x"}`, `{"pool":7}`,
		`{"pool":"a"} {}`, `{"pool":"gpu","gpus":8,"gpu":8}`, `{"\u007f":""}`, `{"end":"2030-01-02T15:04:05Z"}`} {
		for _, i := range []uint8{0, 7, 20, 30, 90, 120} {
			f.Add(i, s)
		}
	}
	mods, err := moduleTable()
	if err != nil {
		f.Fatal(err)
	}
	table := append(api.Table(), mods...) // the modules' commands decode --json the same way
	f.Fuzz(func(t *testing.T, which uint8, raw string) {
		d := table[int(which)%len(table)]
		in, _ := d.Types()
		v, err := decodeInput(in, raw)
		var obj map[string]json.RawMessage
		isObject := json.NewDecoder(strings.NewReader(raw)).Decode(&obj) == nil && obj != nil
		var unknown []string
		for k := range obj {
			if !hasJSONName(in, k) {
				unknown = append(unknown, k)
			}
		}
		if err != nil {
			ae, code := describe(err)
			if code != exitUsage || ae.Code != api.CodeInvalidArgument {
				t.Fatalf("%s --json %q: exit %d, %v; want a usage error", d.Info().FullName(), raw, code, ae)
			}
			if ae.Details["reason"] == "unknown_field" {
				field, _ := ae.Details["field"].(string)
				if !isObject || hasJSONName(in, field) {
					t.Fatalf("%s --json %q: refused the field %q, which the input has", d.Info().FullName(), raw, field)
				}
			}
			return
		}
		if raw != "" && isObject && len(unknown) > 0 {
			t.Fatalf("%s --json %q: accepted, dropping %v", d.Info().FullName(), raw, unknown)
		}
		again, merr := json.Marshal(v.Interface())
		if merr != nil {
			t.Fatal(merr)
		}
		if _, err := decodeInput(in, string(again)); err != nil {
			t.Fatalf("%s: %q decoded to %s, which does not decode: %v", d.Info().FullName(), raw, again, err)
		}
	})
}

// hasJSONName: whether decoding into t fills a top-level name (as encoding/json matches it,
// without regard to case), through embedded structs.
func hasJSONName(t reflect.Type, key string) bool {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && f.Type.Kind() == reflect.Struct && name == "" {
			if hasJSONName(f.Type, key) {
				return true
			}
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if strings.EqualFold(name, key) {
			return true
		}
	}
	return false
}

// TestNoRoomSaysTheShape: a refused reservation says what was asked in words a person reads
// ("8 GPUs", "8 h100 GPUs"), not "8 any GPUs".
func TestNoRoomSaysTheShape(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	conn := connection(t, env.Server(t), env.RootKey)
	if _, err := env.Compute.API.Pools.Create(context.Background(), env.RootKey, api.CreatePool{Name: "gpu"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"reservations", "create", "--pool", "gpu", "--gpus", "8"}, "no room for 8 GPUs"},
		{[]string{"reservations", "create", "--pool", "gpu", "--gpus", "8", "--model", "h100"}, "no room for 8 h100 GPUs"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append(conn, c.args...), &stdout, &stderr)
		if code != exitError || !strings.Contains(stderr.String(), c.says) || strings.Contains(stderr.String(), "any") {
			t.Errorf("better-compute %s = %d %q, want it to say %q", strings.Join(c.args, " "), code, &stderr, c.says)
		}
	}
}
