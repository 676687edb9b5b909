package audit_test

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/audit"
)

// TestKeyIsDerivedFromTheSecret: one secret, one key and origin, every time; another secret,
// another.
func TestKeyIsDerivedFromTheSecret(t *testing.T) {
	t.Parallel()
	a, err := audit.NewKey(computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := audit.NewKey(computetest.Secret)
	c, _ := audit.NewKey(computetest.Secret + "x")
	if a.VerifierKey() != b.VerifierKey() || a.Origin() != b.Origin() {
		t.Fatalf("two keys from one secret: %s, %s", a.VerifierKey(), b.VerifierKey())
	}
	if a.VerifierKey() == c.VerifierKey() || a.Origin() == c.Origin() {
		t.Fatalf("two secrets, one key: %s", a.VerifierKey())
	}
	if !strings.HasPrefix(a.Origin(), audit.OriginPrefix) || !strings.HasPrefix(a.VerifierKey(), a.Origin()+"+") {
		t.Fatalf("origin %q, verifier key %q", a.Origin(), a.VerifierKey())
	}
	if _, err := audit.NewKey(""); err == nil {
		t.Fatal("a key from no secret")
	}
}

// TestWorkerPublishesSignedCheckpoints runs the control plane's workers: the sequencer places
// the events, the audit-checkpoint worker publishes a checkpoint of them, signed by the key the
// secret derives, and audit.checkpoint serves it to the root tenant only.
func TestWorkerPublishesSignedCheckpoints(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	_, tenantKey := env.Tenant(t, "t1")
	ctx := context.Background()
	if _, err := env.Compute.API.Audit.Checkpoint(ctx, env.RootKey, api.GetCheckpoint{}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("checkpoint of an empty log: %v, want failed_precondition", err)
	}
	for range 5 {
		emitRaw(t, env, "reservation.created", "t1", `{"gpus": 8}`)
	}
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var cp api.Checkpoint
	computetest.Eventually(t, 6*audit.CheckpointEvery, "a checkpoint of 5 events", func() bool {
		var err error
		if cp, err = env.Compute.API.Audit.Checkpoint(ctx, env.RootKey, api.GetCheckpoint{}); err != nil && api.CodeOf(err) != api.CodeFailedPrecondition {
			t.Fatal(err)
		}
		return cp.Size >= 5
	})
	key, _ := audit.NewKey(computetest.Secret)
	if cp.VerifierKey != key.VerifierKey() || cp.Origin != key.Origin() {
		t.Fatalf("checkpoint signed by %s (%s), want %s", cp.VerifierKey, cp.Origin, key.VerifierKey())
	}
	s, err := client.OpenCheckpoint(cp, key.VerifierKey())
	if err != nil {
		t.Fatal(err)
	}
	if s.Size != 5 || !s.Time.Equal(cp.CreatedAt) || s.Origin != key.Origin() {
		t.Fatalf("the note says %+v; the checkpoint %+v", s, cp)
	}
	root, err := audit.Root(ctx, env.DB.Pool, 5)
	if err != nil || string(root) != string(s.Root) {
		t.Fatalf("the note's root is %x, the log's %x (%v)", s.Root, root, err)
	}
	if _, err := env.Compute.API.Audit.Checkpoint(ctx, tenantKey, api.GetCheckpoint{}); api.CodeOf(err) != api.CodePermissionDenied {
		t.Fatalf("a tenant's key read the audit tree: %v", err)
	}
	if _, err := env.Compute.API.Audit.ProveInclusion(ctx, tenantKey, api.ProveInclusion{Seq: 1}); api.CodeOf(err) != api.CodePermissionDenied {
		t.Fatalf("a tenant's key proved an inclusion: %v", err)
	}
}

// TestForgedCheckpointsAreRefused: a note whose text was changed, one signed by another key
// under the same name, and a checkpoint whose fields disagree with its note all fail to open,
// each saying why.
func TestForgedCheckpointsAreRefused(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	for range 3 {
		emitRaw(t, env, "node.online", "root", `{}`)
	}
	key, _ := audit.NewKey(computetest.Secret)
	cp := publish(t, env, key)
	if _, err := client.OpenCheckpoint(cp, ""); err != nil {
		t.Fatalf("the genuine checkpoint: %v", err)
	}

	edited := cp
	edited.Note = strings.Replace(cp.Note, "\n3\n", "\n2\n", 1)
	edited.Size = 2
	expectFailure(t, "an edited note", edited, "does not verify: its text was changed after it was signed")

	// The same text and key name, signed by a key that is not the secret's.
	skey, _, err := note.GenerateKey(rand.Reader, key.Origin())
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := note.NewSigner(skey)
	text, _, _ := strings.Cut(cp.Note, "\n\n")
	forged, err := note.Sign(&note.Note{Text: text + "\n"}, signer)
	if err != nil {
		t.Fatal(err)
	}
	other := cp
	other.Note = string(forged)
	expectFailure(t, "a note signed by another key", other, "is not signed by key "+key.Origin())

	lying := cp
	lying.Size = 4
	expectFailure(t, "a size the note does not say", lying, "says size 4, but its signed note says 3")
	lying = cp
	lying.RootHash = make([]byte, 32)
	expectFailure(t, "a root the note does not say", lying, "rootHash is not its signed note's")

	if _, err := env.Compute.API.Audit.Checkpoint(ctx, env.RootKey, api.GetCheckpoint{}); err != nil {
		t.Fatal(err)
	}
}

func expectFailure(t *testing.T, what string, cp api.Checkpoint, says string) {
	t.Helper()
	_, err := client.OpenCheckpoint(cp, "")
	if !errors.Is(err, client.ErrAuditFailed) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v, want an audit failure saying %q", what, err, says)
	}
}

// emitRaw writes an event with data as given (jsonb text) and sequences it.
func emitRaw(t *testing.T, env *computetest.Env, typ, tenant, data string) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.DB.Pool.Exec(ctx, `INSERT INTO compute.events (type, tenant_id, subject, data) VALUES ($1, $2, 'subject-1', $3::jsonb)`, typ, tenant, data); err != nil {
		t.Fatal(err)
	}
	sequence(t, env)
}

// publish publishes a checkpoint of every event sequenced and returns it.
func publish(t *testing.T, env *computetest.Env, key *audit.Key) api.Checkpoint {
	t.Helper()
	cp, _, err := audit.Publish(context.Background(), env.DB, key)
	if err != nil || cp == nil {
		t.Fatalf("publish: %+v %v", cp, err)
	}
	return *cp
}
