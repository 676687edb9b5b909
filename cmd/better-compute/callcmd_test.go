package main

import (
	"strings"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/examples/pingmodule"
)

// TestModuleMethodsThroughTheCLI lists and calls a module's methods, which this binary has no
// subcommands for, from the server's method table.
func TestModuleMethodsThroughTheCLI(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{pingmodule.Module{}}})
	conn := connection(t, env.Server(t), env.RootKey)

	if out := cliRun(t, append(conn, "methods")...); !strings.Contains(out, "pings.setBanner") || !strings.Contains(out, "pools.create") {
		t.Fatalf("methods lists no pings.setBanner or pools.create:\n%s", out)
	}
	var table struct {
		Methods []struct {
			Group, Name string
			InputSchema map[string]any
		}
	}
	runJSON(t, &table, append(conn, "methods")...)
	found := false
	for _, m := range table.Methods {
		found = found || m.Group == "pings" && m.Name == "send" && m.InputSchema["properties"] != nil
	}
	if !found {
		t.Fatal("methods -o json has no pings.send with its input schema")
	}
	cases := []struct {
		args []string
		says string
	}{
		{[]string{"call", "pings.get", "--json", `{"ping":"0190a0b0-0000-7000-8000-000000000001"}`}, "not_found"},
		{[]string{"call", "pings.get", "--json", `{"ping":"x","pingg":1}`}, `unknown field "pingg"`},
		{[]string{"call", "pings.nope"}, `serves no method "pings.nope"`},
		{[]string{"call", "pings.get", "--json", `{`}, "not valid JSON"},
	}
	for _, c := range cases {
		out, err := runErr(t, append(conn, c.args...)...)
		if err == nil || !strings.Contains(out+err.Error(), c.says) {
			t.Errorf("better-compute %s = %v %q, want an error saying %q", strings.Join(c.args, " "), err, out, c.says)
		}
	}
	if out := cliRun(t, append(conn, "call", "pools.create", "--json", `{"name":"via-call"}`, "-o", "json")...); !strings.Contains(out, `"via-call"`) {
		t.Fatalf("call pools.create printed %s", out)
	}
}
