package layers

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestModuleKeepsItsLayers runs the rules on the module as it is.
func TestModuleKeepsItsLayers(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := List(root, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 50 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	for _, v := range Check(pkgs) {
		t.Error(v)
	}
}

// TestRulesCatchBadImports: each rule fails on the import it forbids, and lets the allowed pass.
func TestRulesCatchBadImports(t *testing.T) {
	t.Parallel()
	m := func(r string) string {
		if r == "" {
			return Module
		}
		return Module + "/" + r
	}
	programs := []Package{
		{ImportPath: m("internal/tools/surface"), Name: "surface"},
		{ImportPath: m("cmd/better-compute"), Name: "main"},
	}
	cases := []struct {
		name string
		pkg  Package
		want string // a word of the rule broken; "" when none is
	}{
		{"module imports the core", Package{ImportPath: m("metal"), Name: "metal", Imports: []string{m("internal/core/capacity")}}, "modules.Runtime"},
		{"module's test imports the core", Package{ImportPath: m("vps"), Name: "vps", XTestImports: []string{m("internal/core/access")}}, "modules.Runtime"},
		{"module's test imports a leaf library", Package{ImportPath: m("vps"), Name: "vps", XTestImports: []string{m("internal/lib/sshkrl")}}, ""},
		{"module's code imports a leaf library", Package{ImportPath: m("vps"), Name: "vps", Imports: []string{m("internal/lib/sshkrl")}}, "modules.Runtime"},
		{"module's code depends on internal/ through another", Package{ImportPath: m("metal/redfish"), Name: "redfish", Imports: []string{m("modules")}, Deps: []string{m("modules"), m("internal/core/events")}}, "not even through"},
		{"module's test support uses a leaf library", Package{ImportPath: m("vps/internal/vmtest"), Name: "vmtest", Imports: []string{m("internal/lib/initramfs")}}, ""},
		{"example imports public packages", Package{ImportPath: m("examples/pingmodule"), Name: "pingmodule", Imports: []string{m("modules"), m("api")}, XTestImports: []string{m("sim"), m("computetest")}}, ""},
		{"core links the node agent", Package{ImportPath: m("internal/core/gateway"), Name: "gateway", Deps: []string{m("internal/node/nodeagent")}}, "node-side"},
		{"root links bcd", Package{ImportPath: m(""), Name: "compute", Deps: []string{m("bcd/internal/journal")}}, "node-side"},
		{"core uses a leaf library", Package{ImportPath: m("internal/core/gateway"), Name: "gateway", Deps: []string{m("internal/lib/attest")}}, ""},
		{"api links pgx", Package{ImportPath: m("api"), Name: "api", Deps: []string{"github.com/jackc/pgx/v5"}}, "clients import"},
		{"api links grpc", Package{ImportPath: m("api"), Name: "api", Deps: []string{"google.golang.org/grpc/codes"}}, "clients import"},
		{"client links pgx", Package{ImportPath: m("client"), Name: "client", Deps: []string{"github.com/jackc/pgx/v5/pgconn"}}, "clients import"},
		{"library imports a program", Package{ImportPath: m("client"), Name: "client", TestImports: []string{m("internal/tools/surface")}}, "only programs"},
		{"library imports a main package", Package{ImportPath: m("sim"), Name: "sim", Imports: []string{m("cmd/better-compute")}}, "only programs"},
		{"program imports a program", Package{ImportPath: m("internal/tools/cmd/surface"), Name: "main", Imports: []string{m("internal/tools/surface")}}, ""},
	}
	for _, c := range cases {
		vs := Check(append([]Package{c.pkg}, programs...))
		switch {
		case c.want == "" && len(vs) > 0:
			t.Errorf("%s: broke %v", c.name, vs)
		case c.want != "" && len(vs) == 0:
			t.Errorf("%s: no rule broken, want one about %q", c.name, c.want)
		case c.want != "" && !strings.Contains(vs[0].Rule, c.want):
			t.Errorf("%s: broke %q, want one about %q", c.name, vs[0].Rule, c.want)
		}
	}
}
