package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// run runs the CLI in-process and returns what it printed, failing the test on an error.
func cliRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := runErr(t, args...)
	if err != nil {
		t.Fatalf("better-compute %s: %v", strings.Join(args, " "), err)
	}
	return out
}

func runErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot(&profile{})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := cliRun(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("better-compute %s printed %q: %v", strings.Join(args, " "), out, err)
	}
}

// TestIAMCommands administers an embedded IAM through the CLI, then checks what it made through
// the library: tenants, an identity with a role, its key (and revoking it), flags, meters, a
// delegation and its confirmation.
func TestIAMCommands(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // no config file of the machine's user
	url := pgtest.URL(t, postgres.Core, iam.Migrations)
	db := "--database-url=" + url
	ctx := context.Background()
	pdb, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pdb.Close)
	l, err := iam.Embedded(pdb, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}

	var org, proj iam.Tenant
	runJSON(t, &org, "iam", "tenant", "create", "--id", "acme", "--name", "Acme", db)
	runJSON(t, &proj, "iam", "tenant", "create", "--id", "acme-ml", "--parent", "acme", db)
	if org.Kind != "organization" || proj.Kind != "project" || proj.ParentID != "acme" {
		t.Fatalf("tenants %+v, %+v", org, proj)
	}
	var svc iam.Identity
	runJSON(t, &svc, "iam", "identity", "create", "--tenant", "acme", "--name", "trainer", db)
	policy := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(policy, []byte(`{"version": 1, "statements": [{"effect": "allow", "actions": ["compute:reservations:*"], "resources": ["*"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var role iam.Role
	runJSON(t, &role, "iam", "role", "create", "--tenant", "acme", "--name", "reserver", "--policy", policy, db)
	cliRun(t, "iam", "bind", "--identity", svc.ID, "--role", role.ID, "--tenant", "acme", db)
	var key iam.APIKey
	runJSON(t, &key, "iam", "key", "create", "--identity", svc.ID, "--expires", "24h", db)

	p, err := l.Authenticate(ctx, key.Token)
	if err != nil || p.ID != svc.ID {
		t.Fatalf("the CLI's key authenticates as %+v, %v", p, err)
	}
	for action, want := range map[string]bool{"compute:reservations:create": true, "compute:pools:create": false} {
		d, err := l.Authorize(ctx, p, iam.Request{TenantID: "acme-ml", Action: action, Resource: iam.Resource{Type: "compute-reservation", ID: "*"}})
		if err != nil || d.Allowed != want {
			t.Errorf("%s in the project = %+v, %v; want allowed %v", action, d, err, want)
		}
	}
	cliRun(t, "iam", "key", "revoke", key.ID, db)
	if _, err := l.Authenticate(ctx, key.Token); err == nil {
		t.Fatal("a key revoked by the CLI still authenticates")
	}

	cliRun(t, "iam", "flag", "set", "compute.spot", "--default=false", "--description", "spot reservations", db)
	cliRun(t, "iam", "flag", "override", "compute.spot", "--tenant", "acme", "--value", db)
	var flag struct{ Value bool }
	runJSON(t, &flag, "iam", "flag", "get", "compute.spot", "--tenant", "acme-ml", db)
	if !flag.Value {
		t.Fatal("the project does not inherit its organization's flag override")
	}
	cliRun(t, "iam", "meter", "create", "gpu.h200.hours", "--unit", "GPU-hour", db)
	if _, err := l.RecordUsage(ctx, iam.Usage{TenantID: "acme", Meter: "gpu.h200.hours", Quantity: 3, OccurredAt: time.Now(), IdempotencyKey: "k"}); err != nil {
		t.Fatalf("usage on the CLI's meter: %v", err)
	}
	var usage struct{ Quantity float64 }
	runJSON(t, &usage, "iam", "meter", "usage", "gpu.h200.hours", "--tenant", "acme", db)
	if usage.Quantity != 3 {
		t.Fatalf("usage = %v", usage.Quantity)
	}

	// A delegation with a confirm list, and a confirmation approved from the CLI.
	var ada, bot iam.Identity
	runJSON(t, &ada, "iam", "identity", "create", "--tenant", "acme", "--kind", "user", "--name", "ada", db)
	runJSON(t, &bot, "iam", "identity", "create", "--tenant", "acme", "--kind", "agent", "--name", "bot", db)
	cliRun(t, "iam", "bind", "--identity", bot.ID, "--role", role.ID, "--tenant", "acme", db)
	cliRun(t, "iam", "delegation", "create", "--tenant", "acme", "--person", ada.ID, "--agent", bot.ID, "--confirm", "compute:reservations:release", db)
	var botKey iam.APIKey
	runJSON(t, &botKey, "iam", "key", "create", "--identity", bot.ID, db)
	bp, err := l.Authenticate(ctx, botKey.Token)
	if err != nil {
		t.Fatal(err)
	}
	req := iam.Request{TenantID: "acme", Action: "compute:reservations:release", Resource: iam.Resource{Type: "compute-reservation", ID: "*"}}
	c, err := l.RequestConfirmation(ctx, bp, req)
	if err != nil {
		t.Fatal(err)
	}
	var decided iam.Confirmation
	runJSON(t, &decided, "iam", "confirmation", "approve", c.ID, "--person", ada.ID, db)
	if decided.State != "approved" {
		t.Fatalf("after approve: %+v", decided)
	}
	if d, err := l.Authorize(ctx, bp, req); err != nil || !d.Allowed {
		t.Fatalf("the approved action = %+v, %v", d, err)
	}

	// The audit feed saw the revocation.
	var evs struct{ Items []iam.Event }
	runJSON(t, &evs, "iam", "events", db)
	var types []string
	for _, e := range evs.Items {
		types = append(types, e.Type)
	}
	if !strings.Contains(strings.Join(types, ","), "tenant.created,tenant.created,binding.created,key.revoked,flag.set") {
		t.Fatalf("events = %v", types)
	}

	// A token is the line alone as text, a JSON string with -o json (it was the bare token).
	if tok := strings.TrimSpace(cliRun(t, "iam", "admin-key", "--tenant", "acme", "--name", "ops", db)); !strings.HasPrefix(tok, "biam_key_") {
		t.Fatalf("iam admin-key printed %q", tok)
	}
	var tok string
	runJSON(t, &tok, "iam", "admin-key", "--tenant", "acme", "--name", "ops2", db)
	if !strings.HasPrefix(tok, "biam_key_") {
		t.Fatalf("iam admin-key -o json printed %q", tok)
	}

	// Bad input names what is wrong and changes nothing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"iam", "identity", "create", "--kind", "robot", "--name", "x"}, "robot"},
		{[]string{"iam", "role", "create", "--name", "r"}, "--policy"},
		{[]string{"iam", "key", "create", "--identity", svc.ID, "--expires", "-1h"}, "--expires"},
		{[]string{"iam", "tenant", "delete", "acme"}, "child"},
		{[]string{"iam", "flag", "get", "no.such"}, "no.such"},
	} {
		if _, err := runErr(t, append(c.args, db)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v = %v, want an error naming %q", c.args, err, c.want)
		}
	}
	if _, err := runErr(t, "iam", "tenant", "create", "--id", "x"); err == nil || !strings.Contains(err.Error(), "--database-url") {
		t.Errorf("without a database = %v", err)
	}
}
