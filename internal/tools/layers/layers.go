// Package layers holds the import rules that keep the module's layers apart (docs/architecture.md),
// in the spirit of Tailscale's depaware and deptest: a rule is a function of what `go list` says
// each package imports, and the test in this package fails the build of a change that breaks one.
//
// The layers, from the bottom: leaf libraries (internal/lib), which know nothing of either side;
// the control plane's core (internal/core and the root package) and the node side (internal/node,
// bcd); the public packages around them (api, modules, client, sim, provision, ...); the modules
// (metal, vps, jointokens, examples), which use the core only through modules.Runtime; and
// programs (internal/tools, cmd, the main packages), which may use anything.
package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
)

// Module is the module's import path.
const Module = "github.com/better-compute/compute"

// Package is what `go list -json` says of one package, as far as the rules need.
type Package struct {
	ImportPath   string
	Name         string
	Imports      []string // of its non-test files
	Deps         []string // of its non-test files, transitively
	TestImports  []string // of its _test files in the package
	XTestImports []string // of its _test files in the package's _test package
}

// Violation is one import that breaks a rule.
type Violation struct {
	Package, Import, Rule string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s imports %s: %s", v.Package, v.Import, v.Rule)
}

// List runs `go list` on patterns in dir.
func List(dir string, patterns ...string) ([]Package, error) {
	args := append([]string{"list", "-e", "-json=ImportPath,Name,Imports,Deps,TestImports,XTestImports"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go list: %w: %s", err, ee.Stderr)
		}
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []Package
	for d := json.NewDecoder(strings.NewReader(string(out))); ; {
		var p Package
		if err := d.Decode(&p); err == io.EOF {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// rel is path relative to the module ("" for the root package), or false outside it.
func rel(path string) (string, bool) {
	if path == Module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, Module+"/")
	return r, ok
}

func under(r, dir string) bool { return r == dir || strings.HasPrefix(r, dir+"/") }

// isModule: one of the optional modules, or an example a module author copies.
func isModule(r string) bool {
	return under(r, "metal") || under(r, "vps") || under(r, "jointokens") || under(r, "examples")
}

// isProgram: code no library may depend on.
func isProgram(p Package, r string) bool {
	return p.Name == "main" || under(r, "internal/tools") || under(r, "cmd")
}

// isTestSupport: a package only tests use (pgtest, vmtest and what is under it).
func isTestSupport(r string) bool {
	for _, part := range strings.Split(r, "/") {
		if strings.HasSuffix(part, "test") {
			return true
		}
	}
	return false
}

// isControlPlane: the control plane's own code, which a host links into its process.
func isControlPlane(r string) bool { return r == "" || under(r, "internal/core") }

func isNodeSide(r string) bool { return under(r, "internal/node") || under(r, "bcd") }

// Check returns every violation of the rules among pkgs.
func Check(pkgs []Package) []Violation {
	var vs []Violation
	add := func(p, imp, rule string) { vs = append(vs, Violation{Package: p, Import: imp, Rule: rule}) }
	programs := map[string]bool{}
	for _, p := range pkgs {
		if r, ok := rel(p.ImportPath); ok && isProgram(p, r) {
			programs[p.ImportPath] = true
		}
	}
	for _, p := range pkgs {
		r, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		tests := append(slices.Clone(p.TestImports), p.XTestImports...)
		all := append(slices.Clone(p.Imports), tests...)

		if isModule(r) && p.Name != "main" {
			shipped := !isTestSupport(r)
			for _, imp := range all {
				ir, ok := rel(imp)
				if !ok || !under(ir, "internal") {
					continue
				}
				if under(ir, "internal/lib") && (!shipped || slices.Contains(tests, imp) && !slices.Contains(p.Imports, imp)) {
					continue // a test may use a leaf library
				}
				add(p.ImportPath, imp, "a module uses the core only through modules.Runtime: no internal/ package (internal/lib only in tests)")
			}
			if shipped {
				for _, dep := range p.Deps {
					if dr, ok := rel(dep); ok && under(dr, "internal") && !slices.Contains(p.Imports, dep) {
						add(p.ImportPath, dep, "a module's code depends on no internal/ package, not even through another")
					}
				}
			}
		}
		if isControlPlane(r) {
			for _, dep := range p.Deps {
				if dr, ok := rel(dep); ok && isNodeSide(dr) {
					add(p.ImportPath, dep, "the control plane links no node-side code (internal/node, bcd)")
				}
			}
		}
		if r == "api" || r == "client" {
			for _, dep := range p.Deps {
				if strings.HasPrefix(dep, "github.com/jackc/pgx") || strings.HasPrefix(dep, "google.golang.org/grpc") {
					add(p.ImportPath, dep, "api and client are what clients import: no database driver, no gRPC")
				}
			}
		}
		if !isProgram(p, r) {
			for _, imp := range all {
				if programs[imp] {
					add(p.ImportPath, imp, "only programs import a program package (internal/tools, cmd)")
				}
			}
		}
	}
	return vs
}
