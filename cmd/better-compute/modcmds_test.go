package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestModuleGroupsHaveCommands: the metal and vps groups have commands of their own, made from
// their method table as the core's are, with flags from their inputs (the help promised one
// subcommand per group; they were reached only with call).
func TestModuleGroupsHaveCommands(t *testing.T) {
	t.Parallel()
	root := newRoot(&profile{})
	for _, path := range []string{"machines get", "machines power", "machines deploy-many", "images register", "leases end",
		"join-requests approve", "profiles list", "flavors create", "vm-images register", "instances start", "instances console",
		"sandbox-templates create", "sandboxes extend", "sandbox-snapshots restore", "networks addresses",
		"provider-accounts create", "provider-instances reinstall"} {
		c, rest, err := root.Find(strings.Fields(path))
		if err != nil || len(rest) > 0 || c.CommandPath() != "better-compute "+path {
			t.Errorf("better-compute %s: %v (found %s)", path, err, c.CommandPath())
		}
	}
	mods, err := cliModules()
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: mods})
	conn := connection(t, env.Server(t), env.RootKey)
	for _, args := range [][]string{
		{"flavors", "create", "--name", "small", "--vcpus", "2", "--memory-gib", "4", "--require-labels", "vm=yes"},
		{"networks", "create", "--name", "lan", "--cidr", "10.20.0.0/24", "--dns", "10.20.0.2,10.20.0.3"},
		{"networks", "get", "lan"},
		{"machines", "list"},
		{"profiles", "list", "-o", "yaml"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(conn, args...), &stdout, &stderr); code != 0 {
			t.Fatalf("better-compute %s = %d\n%s%s", strings.Join(args, " "), code, &stdout, &stderr)
		}
	}
	var out bytes.Buffer
	run(append(conn, "flavors", "list", "-o", "json"), &out, &out)
	var flavors api.Page[struct {
		Name          string            `json:"name"`
		VCPUs         int               `json:"vcpus"`
		RequireLabels map[string]string `json:"requireLabels"`
	}]
	if err := json.Unmarshal(out.Bytes(), &flavors); err != nil || len(flavors.Items) != 1 || flavors.Items[0].VCPUs != 2 || flavors.Items[0].RequireLabels["vm"] != "yes" {
		t.Fatalf("flavors list = %v\n%s", err, &out)
	}
}

// TestPositionalIDsAreUniform: a method that acts on one resource of its group takes it as the
// argument in every group, as reservations get does (webhooks test <id> was refused), and an id
// that is a number is read as one.
func TestPositionalIDsAreUniform(t *testing.T) {
	t.Parallel()
	root := newRoot(&profile{})
	for path, arg := range map[string]string{
		"reservations get": "reservation", "webhooks test": "webhook", "webhooks delete": "webhook", "webhooks rotate-secret": "webhook",
		"webhooks deliveries": "webhook", "webhooks redeliver": "delivery", "rollouts get": "rollout", "rollouts pause": "rollout",
		"workflows get": "run", "workflows cancel": "run", "releases get": "version", "approvals approve": "approval",
		"devices set-mode": "device", "join-tokens revoke": "token", "access revoke": "serial", "capacity summary": "pool",
		"machines power": "machine", "leases end": "lease", "instances start": "instance", "sandboxes extend": "sandbox",
		"sandbox-snapshots restore": "snapshot", "sandbox-templates get": "template", "vm-images delete": "image",
		"images delete": "image", "join-requests reject": "request", "provider-accounts delete": "account",
		"provider-instances reinstall": "instance", "networks addresses": "network", "flavors delete": "flavor",
	} {
		c, _, err := root.Find(strings.Fields(path))
		if err != nil || !strings.HasSuffix(c.Use, "["+arg+"]") {
			t.Errorf("better-compute %s: Use %q, want it to take [%s] (%v)", path, c.Use, arg, err)
		}
	}

	env := computetest.New(t, computetest.Options{})
	conn := connection(t, env.Server(t), env.RootKey)
	var out bytes.Buffer
	if code := run(append(conn, "webhooks", "create", "--url", "https://hooks.example.com/x", "-o", "json"), &out, &out); code != 0 {
		t.Fatalf("webhooks create = %d\n%s", code, &out)
	}
	var w api.Webhook
	if err := json.Unmarshal(out.Bytes(), &w); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"webhooks", "test", w.ID}, 0, ""},
		{[]string{"webhooks", "rotate-secret", w.ID, "--keep-previous", "1h"}, 0, ""},
		{[]string{"webhooks", "redeliver", "x"}, exitUsage, `"x" is not a delivery (a number)`},
		{[]string{"webhooks", "redeliver", "2147483000"}, exitError, "not_found"},
		{[]string{"webhooks", "delete", w.ID}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(conn, c.args...), &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("better-compute %s = %d\n%s%s", strings.Join(c.args, " "), code, &stdout, &stderr)
		}
	}
}
