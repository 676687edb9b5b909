package iam

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// Event is one entry of IAM's event feed: what changed (a key revoked, a tenant deleted, a role
// created), for caches to follow and for audit.
type Event struct {
	ID        int64          `json:"id"`
	Type      string         `json:"type"`
	TenantID  string         `json:"tenantId"`
	Subject   string         `json:"subject"`
	Data      map[string]any `json:"data"`
	CreatedAt time.Time      `json:"createdAt"`
}

// Event types Better Compute acts on.
const (
	EventKeyRevoked    = "key.revoked"
	EventTokenRevoked  = "token.revoked"
	EventTenantDeleted = "tenant.deleted"
	EventTenantCreated = "tenant.created"
	EventFlagSet       = "flag.set"
	// EventBindingCreated: an identity gained a role, so what was denied to it may now be allowed.
	EventBindingCreated = "binding.created"
)

func (l *Local) event(ctx context.Context, q postgres.Querier, typ, tenant, subject string, data map[string]any) error {
	if data == nil {
		data = map[string]any{}
	}
	_, err := q.Exec(ctx, `INSERT INTO iam.events (type, tenant_id, subject, data, tenant_path)
		SELECT $1, $2, $3, $4, coalesce(array_agg(id ORDER BY depth), '{}') FROM (
		  WITH RECURSIVE up (id, parent_id, depth) AS (
		    SELECT id, parent_id, 0 FROM iam.tenants WHERE id = $2
		    UNION ALL
		    SELECT t.id, t.parent_id, up.depth + 1 FROM iam.tenants t JOIN up ON t.id = up.parent_id
		  ) SELECT id, depth FROM up) path`, typ, tenant, subject, data)
	if err != nil {
		return fmt.Errorf("iam: record event %s: %w", typ, err)
	}
	return nil
}

// Events implements Port: the events after the cursor after, oldest first, and the cursor to
// continue from. A negative after starts at the end: no events, and the current cursor.
func (l *Local) Events(ctx context.Context, after int64, limit int) ([]Event, int64, error) {
	return l.events(ctx, after, limit, "")
}

// events is Events seen from a caller in tenant within: only events of within and its
// descendants (all, when within is empty or the root). The cursor still moves past the others.
func (l *Local) events(ctx context.Context, after int64, limit int, within string) ([]Event, int64, error) {
	if within == l.opts.RootTenantID {
		within = ""
	}
	if after < 0 {
		var last int64
		err := l.db.Pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM iam.events`).Scan(&last)
		return nil, last, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	rows, err := l.db.Pool.Query(ctx, `SELECT id, type, tenant_id, subject, data, created_at, $3 = '' OR $3 = ANY(tenant_path)
		FROM iam.events WHERE id > $1 ORDER BY id LIMIT $2`, after, limit, within)
	if err != nil {
		return nil, after, err
	}
	next := after
	var evs []Event
	var e Event
	var visible bool
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.Type, &e.TenantID, &e.Subject, &e.Data, &e.CreatedAt, &visible}, func() error {
		next = e.ID
		if visible {
			evs = append(evs, e)
		}
		e = Event{}
		return nil
	})
	if err != nil {
		return nil, after, err
	}
	return evs, next, nil
}

// Follow calls fn with every event of p from now on, until ctx ends, asking every interval.
func Follow(ctx context.Context, p Port, interval time.Duration, fn func(Event)) error {
	_, cursor, err := p.Events(ctx, -1, 0)
	if err != nil {
		return err
	}
	return FollowFrom(ctx, p, cursor, interval, fn)
}

// FollowFrom calls fn with every event of p after cursor, until ctx ends, asking every interval.
// A cache that forgets everything when it starts following reads the cursor first, forgets, then
// follows from that cursor: an event written between the two is then seen, not skipped.
func FollowFrom(ctx context.Context, p Port, cursor int64, interval time.Duration, fn func(Event)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		evs, next, err := p.Events(ctx, cursor, 0)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, e := range evs {
			fn(e)
		}
		cursor = next
	}
}

// DeleteTenant deletes a tenant that has no child tenants, with its identities, keys and roles.
// The root cannot be deleted.
func (l *Local) DeleteTenant(ctx context.Context, id string) error {
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		var kind string
		var children int
		err := tx.QueryRow(ctx, `SELECT kind, (SELECT count(*) FROM iam.tenants c WHERE c.parent_id = t.id) FROM iam.tenants t WHERE id = $1 FOR UPDATE`, id).Scan(&kind, &children)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("iam: tenant %q: %w", id, ErrNotFound)
		}
		switch {
		case err != nil:
			return err
		case kind == "root":
			return fmt.Errorf("iam: the root tenant cannot be deleted")
		case children > 0:
			return fmt.Errorf("iam: tenant %s has %d child tenants; delete them first", id, children)
		}
		// The event first, while the tenant's path can still be read.
		if err := l.event(ctx, tx, EventTenantDeleted, id, id, nil); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM iam.tenants WHERE id = $1`, id)
		return err
	})
	if err == nil {
		// After the commit, so that no read repopulates a cache with the tenant still there.
		l.Invalidate(Event{Type: EventTenantDeleted, Subject: id})
	}
	return err
}

// Invalidator is a port with caches of its own that an IAM event can make stale. Better Compute
// passes it every event it follows, so a change made by another process is seen at once rather
// than within the cache's lifetime.
type Invalidator interface {
	Invalidate(e Event)
}

// Invalidate implements Invalidator.
func (l *Local) Invalidate(e Event) {
	switch e.Type {
	case EventKeyRevoked, EventTokenRevoked:
		l.auth.clear()
	case EventBindingCreated:
		l.policyCache.clear()
	case EventTenantDeleted:
		l.auth.clear()
		l.policyCache.clear()
		l.pathCache.clear()
	}
}
