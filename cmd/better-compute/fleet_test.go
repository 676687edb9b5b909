package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestFleetThroughTheCLI runs fleet as code the way an operator does, against a control plane
// over HTTP: export to a file, edit it, plan (a diff and the command to apply it), apply with
// the plan's fingerprint, plan again (nothing), see drift after a change by hand, and have a
// stale plan and a bad document refused with what is wrong.
func TestFleetThroughTheCLI(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	conn := connection(t, env.Server(t), env.RootKey)
	ctx := context.Background()
	if _, err := env.Compute.API.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "fra1", DisplayName: "Frankfurt"}); err != nil {
		t.Fatal(err)
	}
	cli := func(want int, args ...string) (string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(append(conn, args...), &stdout, &stderr); code != want {
			t.Fatalf("better-compute %s exited %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, want, &stdout, &stderr)
		}
		return stdout.String(), stderr.String()
	}
	file := filepath.Join(t.TempDir(), "fleet.yaml")
	cli(0, "fleet", "export", "-f", file)
	doc, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(doc), "kind: FleetConfig\n") || !strings.Contains(string(doc), "  - name: fra1\n    displayName: Frankfurt\n") {
		t.Fatalf("exported %q, %v", doc, err)
	}
	edited := strings.Replace(string(doc), "displayName: Frankfurt\n", "displayName: Frankfurt 1\n  - name: par1\n", 1)
	if err := os.WriteFile(file, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}

	out, _ := cli(0, "fleet", "plan", "-f", file)
	for _, want := range []string{"  ~ site fra1  (spec.sites[0])\n      displayName: \"Frankfurt\" → \"Frankfurt 1\"\n", "  + site par1  (spec.sites[1])\n",
		"Plan: 1 to create, 1 to update, 0 to delete.\n", "better-compute fleet apply -f " + file + " --fingerprint sha256:"} {
		if !strings.Contains(out, want) {
			t.Fatalf("plan output lacks %q:\n%s", want, out)
		}
	}
	fp := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(out)

	cli(2, "fleet", "apply", "-f", file) // neither a fingerprint nor --yes
	out, _ = cli(0, "fleet", "apply", "-f", file, "--fingerprint", fp)
	if !strings.Contains(out, "Applied to tenant root: 1 created, 1 updated, 0 deleted") {
		t.Fatalf("apply output:\n%s", out)
	}
	if out, _ = cli(0, "fleet", "plan", "-f", file); !strings.Contains(out, "No changes") {
		t.Fatalf("plan after the apply:\n%s", out)
	}
	_, errOut := cli(1, "fleet", "apply", "-f", file, "--fingerprint", fp)
	if !strings.Contains(errOut, "failed_precondition: the plan is stale") {
		t.Fatalf("apply of the old plan again:\n%s", errOut)
	}

	if _, err := env.Compute.API.Sites.Update(ctx, env.RootKey, api.UpdateSite{Site: "par1", Labels: &map[string]string{"by": "hand"}}); err != nil {
		t.Fatal(err)
	}
	out, _ = cli(0, "fleet", "drift")
	if !strings.Contains(out, "  ~ site par1  (spec.sites[1])\n      labels: {\"by\":\"hand\"} → (none)\n") {
		t.Fatalf("drift output:\n%s", out)
	}

	bad := strings.Replace(edited, "  - name: par1\n", "  - nmae: par1\n", 1)
	if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut = cli(1, "fleet", "plan", "-f", file)
	if !strings.Contains(errOut, "spec.sites[1].nmae: unknown field") || !strings.Contains(errOut, "field: spec.sites[1].nmae") {
		t.Fatalf("plan of a bad document:\n%s", errOut)
	}
}
