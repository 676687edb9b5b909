package events

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// SequenceEvery is how often the sequencer gives committed events their place in the log: the
// most an event waits before readers see it.
const SequenceEvery = 100 * time.Millisecond

// sequenceBatch bounds the events one sequencer transaction places.
const sequenceBatch = 10_000

// sequencerLock is the advisory lock one sequencer at a time holds, for its transaction.
const sequencerLock = 0x636f6d7075746501 // "compute" 1

// Sequence gives the committed events that have none their place in the log (seq), in the order
// of their row ids, after the last event placed. Sequencers of several processes take turns under
// an advisory lock; one that finds it taken does nothing this time. It returns how many events it
// placed.
func Sequence(ctx context.Context, db *postgres.DB) (int, error) {
	var n int
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(sequencerLock)).Scan(&mine); err != nil || !mine {
			return err
		}
		// Under the lock, the last seq is the last committed one: the sequencer before this one
		// committed before the lock was free.
		tag, err := tx.Exec(ctx, `WITH base AS (SELECT coalesce(max(seq), 0) AS s FROM compute.events),
			  next AS (SELECT id, row_number() OVER (ORDER BY id) AS rn
			           FROM (SELECT id FROM compute.events WHERE seq IS NULL ORDER BY id LIMIT $1) u)
			UPDATE compute.events e SET seq = base.s + next.rn FROM next, base WHERE e.id = next.id`, sequenceBatch)
		n = int(tag.RowsAffected())
		return err
	})
	return n, err
}

// List reads a tenant's events in log order after the event id after, at most limit, filtered by
// type (an exact type, or a prefix ending in ".") and subject when not empty.
func List(ctx context.Context, q postgres.Querier, tenant string, after int64, typ, subject string, limit int) ([]api.Event, error) {
	exact, prefix := typ, ""
	if strings.HasSuffix(typ, ".") {
		exact, prefix = "", typ
	}
	rows, err := q.Query(ctx, `SELECT seq, type, tenant_id, subject, data, created_at FROM compute.events
		WHERE tenant_id = $1 AND seq > $2 AND seq IS NOT NULL
		  AND ($3 = '' OR type = $3) AND ($4 = '' OR starts_with(type, $4)) AND ($5 = '' OR subject = $5)
		ORDER BY seq LIMIT $6`, tenant, after, exact, prefix, subject, limit)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[api.Event])
	if err != nil {
		return nil, fmt.Errorf("events: list: %w", err)
	}
	return out, nil
}

// Module owns the event log: its schema, its sequencer and events.list. Its zero value is ready.
type Module struct {
	mu     sync.Mutex
	placed chan struct{} // closed (and replaced) when this process's sequencer places events
}

// Sequenced returns a channel that is closed the next time this process's sequencer gives
// events their place in the log: readers of the log in this process (the webhook fan-out) wait
// on it instead of polling. Sequencers of other processes do not close it.
func (m *Module) Sequenced() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.placed == nil {
		m.placed = make(chan struct{})
	}
	return m.placed
}

func (m *Module) notePlaced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.placed != nil {
		close(m.placed)
		m.placed = nil
	}
}

// Name implements modules.Module.
func (*Module) Name() string { return "events" }

// Register implements modules.Module.
func (m *Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceEvent, Description: "The event log: what changed, in order."})
	r.Actions(modules.ActionsFor(api.EventMethods()...)...)
	r.Worker(modules.Worker{Name: "events-sequencer", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, SequenceEvery, func() error {
			n, err := Sequence(ctx, rt.DB)
			if n > 0 {
				m.notePlaced()
			}
			return err
		})
	}})
	modules.Handle(r, api.EventsList, nil, func(ctx context.Context, c *modules.Call, in api.ListEvents) (api.Page[api.Event], error) {
		after, err := in.EventAfter()
		if err != nil {
			return api.Page[api.Event]{}, err
		}
		limit := in.PageLimit()
		items, err := List(ctx, c.Tx, c.Target.TenantID, after, in.Type, in.Subject, limit)
		if err != nil {
			return api.Page[api.Event]{}, err
		}
		if items == nil {
			items = []api.Event{}
		}
		page := api.Page[api.Event]{Items: items}
		if len(items) == limit {
			page.NextCursor = api.EventCursor(items[len(items)-1].ID)
		}
		return page, nil
	})
	return nil
}
