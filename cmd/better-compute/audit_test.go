package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/audit"
	"github.com/better-compute/compute/internal/core/events"
)

// TestAuditVerifyThroughTheCLI saves a checkpoint with better-compute audit checkpoint -o json,
// changes the log in SQL, and runs better-compute audit verify against the control plane over
// HTTP: it exits 0 on the untouched log, 1 with AUDIT FAILED and what is wrong on each
// tampering, and --update rolls the saved checkpoint forward.
func TestAuditVerifyThroughTheCLI(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		sql  []string
		says string // "" for success
	}{
		{name: "untouched"},
		{name: "data edited", sql: []string{`UPDATE compute.events SET data = '{"gpus": 64}' WHERE seq = 3`},
			says: "AUDIT FAILED: the event log as it is now does not hash to the root of the latest checkpoint (events 1..6"},
		{name: "an event deleted", sql: []string{`DELETE FROM compute.events WHERE seq = 2`},
			says: "AUDIT FAILED: the control plane cannot prove event 6 in the tree of 6: failed_precondition: audit: the event log has a gap: there is no event 2"},
		{name: "two events swapped", sql: []string{`UPDATE compute.events SET seq = -seq WHERE seq IN (1, 4)`,
			`UPDATE compute.events SET seq = CASE seq WHEN -1 THEN 4 ELSE 1 END WHERE seq IN (-1, -4)`},
			says: "AUDIT FAILED: the event log as it is now does not hash to the root"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env, file, conn := auditedCLI(t, 6)
			for _, s := range c.sql {
				if _, err := env.DB.Pool.Exec(context.Background(), s); err != nil {
					t.Fatal(err)
				}
			}
			var stdout, stderr bytes.Buffer
			code := run(append(conn, "audit", "verify", "--checkpoint", file), &stdout, &stderr)
			if c.says == "" {
				if code != 0 || !strings.HasPrefix(stdout.String(), "OK: the event log holds events 1..6") {
					t.Fatalf("audit verify of the untouched log exited %d\nstdout: %s\nstderr: %s", code, &stdout, &stderr)
				}
				return
			}
			if code != exitError || !strings.Contains(stderr.String(), c.says) || stdout.Len() != 0 {
				t.Fatalf("audit verify after %s exited %d\nstdout: %s\nstderr: %s\nwant exit 1 saying %q", c.name, code, &stdout, &stderr, c.says)
			}
			t.Logf("%s", &stderr)
			// As JSON: the API's error envelope, its reason audit_failed.
			stdout.Reset()
			stderr.Reset()
			code = run(append(conn, "audit", "verify", "--checkpoint", file, "-o", "json"), &stdout, &stderr)
			var e struct{ Error *api.Error }
			if code != exitError || json.Unmarshal(stderr.Bytes(), &e) != nil || e.Error == nil ||
				e.Error.Code != api.CodeFailedPrecondition || e.Error.Details["reason"] != "audit_failed" {
				t.Fatalf("audit verify -o json after %s exited %d: %s", c.name, code, &stderr)
			}
		})
	}
}

// TestAuditVerifyUpdate: after the log grew and was checkpointed again, verify --update replaces
// the saved checkpoint with the latest; prove-inclusion takes its event id as a flag; a missing
// --checkpoint is a usage error.
func TestAuditVerifyUpdate(t *testing.T) {
	t.Parallel()
	env, file, conn := auditedCLI(t, 3)
	emitAndPublish(t, env, 4)
	var stdout, stderr bytes.Buffer
	if code := run(append(conn, "audit", "verify", "--checkpoint", file, "--update"), &stdout, &stderr); code != 0 {
		t.Fatalf("audit verify --update exited %d: %s", code, &stderr)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cp api.Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil || cp.Size != 7 {
		t.Fatalf("the saved checkpoint after --update: %s (%v)", b, err)
	}
	var incl api.InclusionProof
	runJSON(t, &incl, append(conn, "audit", "prove-inclusion", "--seq", "2")...)
	if incl.LeafIndex != 1 || incl.Size != 7 || len(incl.Hashes) != 3 {
		t.Fatalf("audit prove-inclusion --seq 2: %+v", incl)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(append(conn, "audit", "verify"), &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--checkpoint FILE is required") {
		t.Fatalf("audit verify without --checkpoint exited %d: %s", code, &stderr)
	}
}

// auditedCLI is a control plane served over HTTP, the CLI pointed at it with the root key,
// n events in its log and a checkpoint of them saved by the CLI to a file.
func auditedCLI(t *testing.T, n int) (*computetest.Env, string, []string) {
	t.Helper()
	env := computetest.New(t, computetest.Options{})
	conn := connection(t, env.Server(t), env.RootKey)
	emitAndPublish(t, env, n)
	var stdout, stderr bytes.Buffer
	if code := run(append(conn, "audit", "checkpoint", "-o", "json"), &stdout, &stderr); code != 0 {
		t.Fatalf("audit checkpoint exited %d: %s", code, &stderr)
	}
	file := filepath.Join(t.TempDir(), "checkpoint.json")
	if err := os.WriteFile(file, stdout.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return env, file, conn
}

// emitAndPublish writes n events, sequences them and publishes a checkpoint, as the workers do.
func emitAndPublish(t *testing.T, env *computetest.Env, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		if err := events.Emit(ctx, env.DB.Pool, "reservation.created", "root", fmt.Sprintf("r-%d", i), map[string]any{"gpus": i}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := events.Sequence(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	key, err := audit.NewKey(computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := audit.Publish(ctx, env.DB, key); err != nil {
		t.Fatal(err)
	}
}
