package audit_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/audit"
	"github.com/better-compute/compute/internal/core/events"
)

func sequence(t *testing.T, env *computetest.Env) {
	t.Helper()
	if _, err := events.Sequence(context.Background(), env.DB); err != nil {
		t.Fatal(err)
	}
}

// audited is a control plane whose log holds ten events of three tenants, with a checkpoint of
// them saved, and a client of its API over HTTP with the root key.
type audited struct {
	env   *computetest.Env
	key   *audit.Key
	cl    *client.Client
	saved api.Checkpoint
}

func newAudited(t *testing.T) *audited {
	t.Helper()
	env := computetest.New(t, computetest.Options{})
	env.Tenant(t, "t1")
	env.Tenant(t, "t2")
	for i := range 10 {
		emitRaw(t, env, "reservation.created", []string{"root", "t1", "t2"}[i%3], fmt.Sprintf(`{"gpus": %d, "pool": "p%d"}`, i+1, i))
	}
	key, err := audit.NewKey(computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(env.Server(t), client.WithAPIKey(env.RootKey), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	publish(t, env, key)
	saved, err := cl.Audit.Checkpoint(context.Background(), api.GetCheckpoint{})
	if err != nil {
		t.Fatal(err)
	}
	return &audited{env: env, key: key, cl: cl, saved: saved}
}

func (a *audited) exec(t *testing.T, sql ...string) {
	t.Helper()
	for _, s := range sql {
		if _, err := a.env.DB.Pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// TestAuditVerifyFailsOnEveryTampering saves a checkpoint of ten events, then changes the log
// directly in SQL, as someone with the database but not the secret could: audit verification
// of the saved checkpoint against the live log fails each time, saying what is wrong, and passes
// on the untouched log and on one that only grew.
func TestAuditVerifyFailsOnEveryTampering(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		tamper func(t *testing.T, a *audited)
		says   string // "" for a log that must verify
	}{
		{name: "untouched", tamper: func(*testing.T, *audited) {}},
		{name: "grown and checkpointed again", tamper: func(t *testing.T, a *audited) {
			for range 7 {
				emitRaw(t, a.env, "node.online", "t1", `{}`)
			}
			publish(t, a.env, a.key)
			emitRaw(t, a.env, "node.offline", "t1", `{}`) // sequenced, not yet in a checkpoint
		}},
		{name: "an event's data edited", says: "does not hash to the root of the latest checkpoint (events 1..10",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET data = '{"gpus": 1, "pool": "p3"}' WHERE seq = 4`)
			}},
		{name: "an event's time moved by a microsecond", says: "does not hash to the root",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET created_at = created_at + interval '1 microsecond' WHERE seq = 9`)
			}},
		{name: "an event's tenant changed", says: "does not hash to the root",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET tenant_id = 't2' WHERE seq = 1`)
			}},
		{name: "an event deleted", says: "there is no event 5 (the next is 6): a row of compute.events was deleted",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `DELETE FROM compute.events WHERE seq = 5`)
			}},
		{name: "the last event deleted", says: "it holds events up to 9, not 10",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `DELETE FROM compute.events WHERE seq = 10`)
			}},
		{name: "two events swapped", says: "does not hash to the root",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET seq = -seq WHERE seq IN (3, 7)`,
					`UPDATE compute.events SET seq = CASE seq WHEN -3 THEN 7 ELSE 3 END WHERE seq IN (-3, -7)`)
			}},
		{name: "an event deleted and the rest renumbered", says: "does not hash to the root",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `DELETE FROM compute.events WHERE seq = 2`, `UPDATE compute.events SET seq = -(seq - 1) WHERE seq > 2`,
					`UPDATE compute.events SET seq = -seq WHERE seq < 0`)
				emitRaw(t, a.env, "node.online", "root", `{}`) // the log is ten events long again
			}},
		{name: "an event edited, then the log grew and was checkpointed", says: "is not consistent with the saved checkpoint of events 1..10",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET subject = 'someone-else' WHERE seq = 2`)
				for range 5 {
					emitRaw(t, a.env, "node.online", "root", `{}`)
				}
				publish(t, a.env, a.key)
			}},
		{name: "an event edited and the tree re-signed", says: "covers the same 10 events as the saved one but has another root",
			tamper: func(t *testing.T, a *audited) {
				a.exec(t, `UPDATE compute.events SET data = '{}' WHERE seq = 6`, `DELETE FROM compute.audit_checkpoints`)
				publish(t, a.env, a.key) // the publisher signs what it finds
			}},
		{name: "the checkpoints deleted", says: "cannot read the latest checkpoint",
			tamper: func(t *testing.T, a *audited) { a.exec(t, `DELETE FROM compute.audit_checkpoints`) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAudited(t)
			c.tamper(t, a)
			latest, err := a.cl.VerifyCheckpoint(context.Background(), a.saved, "")
			if c.says == "" {
				if err != nil {
					t.Fatalf("verification of an untampered log failed: %v", err)
				}
				if latest.Size < a.saved.Size {
					t.Fatalf("latest checkpoint %d before the saved %d", latest.Size, a.saved.Size)
				}
				return
			}
			if !errors.Is(err, client.ErrAuditFailed) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("verification after %s: %v\nwant an audit failure saying %q", c.name, err, c.says)
			}
			t.Logf("%s: %v", c.name, err)
		})
	}
}

// TestVerifyEvent: an event as events.list gives it is in the checkpoint; the same event with
// a field changed is not; once its row is edited in SQL, it no longer proves.
func TestVerifyEvent(t *testing.T) {
	t.Parallel()
	a := newAudited(t)
	ctx := context.Background()
	page, err := a.cl.Events.List(ctx, api.ListEvents{TenantID: "t1"})
	if err != nil || len(page.Items) == 0 {
		t.Fatalf("events of t1: %+v %v", page, err)
	}
	e := page.Items[0]
	if err := a.cl.VerifyEvent(ctx, a.saved, "", e); err != nil {
		t.Fatalf("event %d as listed: %v", e.ID, err)
	}
	changed := e
	changed.Data = map[string]any{"gpus": 99}
	if err := a.cl.VerifyEvent(ctx, a.saved, "", changed); !errors.Is(err, client.ErrAuditFailed) || !strings.Contains(err.Error(), "not as given: its data is") {
		t.Fatalf("event %d with other data: %v", e.ID, err)
	}
	changed = e
	changed.Subject = "other"
	if err := a.cl.VerifyEvent(ctx, a.saved, "", changed); !errors.Is(err, client.ErrAuditFailed) || !strings.Contains(err.Error(), "its subject is") {
		t.Fatalf("event %d with another subject: %v", e.ID, err)
	}
	a.exec(t, fmt.Sprintf(`UPDATE compute.events SET data = '{"gpus": 99}' WHERE seq = %d`, e.ID))
	if err := a.cl.VerifyEvent(ctx, a.saved, "", e); !errors.Is(err, client.ErrAuditFailed) || !strings.Contains(err.Error(), "as the log holds it now is not in the checkpoint") {
		t.Fatalf("event %d after its row was edited: %v", e.ID, err)
	}
}
