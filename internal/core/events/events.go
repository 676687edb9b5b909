// Package events owns the event outbox (compute.events): every change worth telling anyone
// about is written there in the same transaction as the change.
package events

import (
	"context"
	"embed"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the outbox's schema.
var Migrations = postgres.EmbeddedMigrations("events", "compute", migrationsFS)

// Event is one entry of the outbox.
type Event struct {
	ID        int64          `json:"id"`
	Type      string         `json:"type"` // e.g. reservation.preempted
	TenantID  string         `json:"tenantId"`
	Subject   string         `json:"subject"`
	Data      map[string]any `json:"data"`
	CreatedAt time.Time      `json:"createdAt"`
}

// Emit writes an event in the caller's transaction.
func Emit(ctx context.Context, q postgres.Querier, typ, tenant, subject string, data map[string]any) error {
	if data == nil {
		data = map[string]any{}
	}
	_, err := q.Exec(ctx, `INSERT INTO compute.events (type, tenant_id, subject, data) VALUES ($1, $2, $3, $4)`, typ, tenant, subject, data)
	return err
}

// QueueEmit adds an event to a batch, to be sent with the statements around it.
func QueueEmit(b *pgx.Batch, typ, tenant, subject string, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	b.Queue(`INSERT INTO compute.events (type, tenant_id, subject, data) VALUES ($1, $2, $3, $4)`, typ, tenant, subject, data)
}

// QueueEmitMany adds one event of a type per subject to a batch, as one statement: data[i] is
// subjects[i]'s (nil reads as {}). A batch of placements writes its events so.
func QueueEmitMany(b *pgx.Batch, typ, tenant string, subjects []string, data []map[string]any) {
	rows := make([]map[string]any, len(data))
	for i, d := range data {
		if rows[i] = d; d == nil {
			rows[i] = map[string]any{}
		}
	}
	b.Queue(`INSERT INTO compute.events (type, tenant_id, subject, data)
		SELECT $1, $2, u.subject, u.data FROM unnest($3::text[], $4::jsonb[]) WITH ORDINALITY AS u(subject, data, i) ORDER BY u.i`,
		typ, tenant, subjects, rows)
}

// EmitEach writes one event of a type per subject in the caller's transaction, as one statement:
// subjects[i] belongs to tenants[i], and every event carries data. Nodes taken offline together
// are recorded so: one statement for 10,000, not 10,000.
func EmitEach(ctx context.Context, q postgres.Querier, typ string, tenants, subjects []string, data map[string]any) error {
	rows := make([]map[string]any, len(subjects))
	for i := range rows {
		rows[i] = data
	}
	return EmitRows(ctx, q, typ, tenants, subjects, rows)
}

// EmitRows is EmitEach with data of each event's own: data[i] is subjects[i]'s (nil reads as {}).
func EmitRows(ctx context.Context, q postgres.Querier, typ string, tenants, subjects []string, data []map[string]any) error {
	if len(subjects) == 0 {
		return nil
	}
	rows := make([]map[string]any, len(data))
	for i, d := range data {
		if rows[i] = d; d == nil {
			rows[i] = map[string]any{}
		}
	}
	_, err := q.Exec(ctx, `INSERT INTO compute.events (type, tenant_id, subject, data)
		SELECT $1, u.tenant, u.subject, u.data FROM unnest($2::text[], $3::text[], $4::jsonb[]) WITH ORDINALITY AS u(tenant, subject, data, i) ORDER BY u.i`,
		typ, tenants, subjects, rows)
	return err
}

// EmitChanged runs change, a data-modifying statement whose RETURNING list is (tenant_id,
// subject, data), and writes an event of typ for each row it returns, in the same statement: a
// change and its events in one round trip, without a transaction around them. It returns the
// events' data. args are change's; typ is passed after them.
func EmitChanged(ctx context.Context, q postgres.Querier, typ, change string, args ...any) ([]map[string]any, error) {
	rows, err := q.Query(ctx, `WITH changed AS (`+change+`)
		INSERT INTO compute.events (type, tenant_id, subject, data)
		SELECT $`+strconv.Itoa(len(args)+1)+`, tenant_id, subject, data FROM changed RETURNING data`, append(args, typ)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[map[string]any])
}

// About returns the events about subject, oldest first.
func About(ctx context.Context, q postgres.Querier, subject string) ([]Event, error) {
	rows, err := q.Query(ctx, `SELECT id, type, tenant_id, subject, data, created_at FROM compute.events WHERE subject = $1 ORDER BY id`, subject)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
}
