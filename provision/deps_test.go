package provision_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProvisionImportsNeitherModulesNorInternal keeps the package below modules (which imports
// it: the other way is a cycle) and outside the core, so that metal, vps and a host's own
// provisioning code can use its types without linking the control plane.
func TestProvisionImportsNeitherModulesNorInternal(t *testing.T) {
	t.Parallel()
	const self = "github.com/better-compute/compute/"
	out, err := exec.Command("go", "list", "-deps", self+"provision").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == self+"modules" || strings.HasPrefix(dep, self) && strings.Contains(dep, "/internal") {
			t.Errorf("provision depends on %s", dep)
		}
	}
}
