package webhooks

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// fanoutBatch bounds the events one fan-out transaction gives deliveries.
const fanoutBatch = 1000

// maxAttempts is River's bound on a delivery job's attempts, far beyond what the dead-letter
// age allows at the longest backoff: the age decides when a delivery is given up.
const maxAttempts = 10_000

// deliverArgs is the River job that attempts a delivery. Generation is the delivery's when the
// job was enqueued: a redelivery enqueues a job of the next one, and the older stands down.
type deliverArgs struct {
	Delivery   int64 `json:"delivery"`
	Generation int   `json:"generation"`
}

func (deliverArgs) Kind() string { return "webhook.deliver" }

func (deliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Queue, MaxAttempts: maxAttempts}
}

// Fanout gives the events sequenced since the last fan-out their deliveries, one per endpoint
// of the event's tenant whose filter matches, and enqueues a job for each, in one transaction
// that also moves the fan-out's place in the log: every event is fanned out once. A fan-out
// that finds another process's in progress does nothing this time. It returns how many
// deliveries it made.
func Fanout(ctx context.Context, db *postgres.DB, jobs modules.Jobs) (int, error) {
	var n int
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		var from int64
		err := tx.QueryRow(ctx, `SELECT seq FROM compute.webhook_fanout FOR UPDATE SKIP LOCKED`).Scan(&from)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // another fan-out holds it
		}
		if err != nil {
			return err
		}
		var to *int64
		if err := tx.QueryRow(ctx, `SELECT max(seq) FROM (SELECT seq FROM compute.events WHERE seq > $1 ORDER BY seq LIMIT $2) s`,
			from, fanoutBatch).Scan(&to); err != nil || to == nil {
			return err
		}
		// Each tenant's backlog before this batch, for the deliveries' priorities (fairShare).
		backlog := map[string]int{}
		rows, err := tx.Query(ctx, `SELECT w.tenant_id, count(*) FROM compute.webhook_deliveries d
			JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id WHERE d.state = 'pending' GROUP BY 1`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var tenant string
			var n int
			if err := rows.Scan(&tenant, &n); err != nil {
				rows.Close()
				return err
			}
			backlog[tenant] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `WITH made AS (INSERT INTO compute.webhook_deliveries (endpoint_id, event_seq, subject)
			SELECT w.id, e.seq, e.subject FROM compute.events e JOIN compute.webhook_endpoints w ON w.tenant_id = e.tenant_id AND w.after_seq < e.seq
			WHERE e.seq > $1 AND e.seq <= $2
			  AND ((e.type = 'webhook.test' AND e.subject = w.id::text)
			    OR (NOT starts_with(e.type, 'webhook.') AND (cardinality(w.event_types) = 0 OR e.type = ANY (w.event_types)
			        OR EXISTS (SELECT 1 FROM unnest(w.event_types) f WHERE right(f, 1) = '.' AND starts_with(e.type, f)))))
			ORDER BY e.seq
			ON CONFLICT (endpoint_id, event_seq) DO NOTHING RETURNING id, endpoint_id)
			SELECT made.id, w.tenant_id FROM made JOIN compute.webhook_endpoints w ON w.id = made.endpoint_id ORDER BY made.id`, from, *to)
		if err != nil {
			return err
		}
		made, err := pgx.CollectRows(rows, pgx.RowToStructByPos[madeDelivery])
		if err != nil {
			return err
		}
		if err := jobs.InsertManyTx(ctx, tx, fairShare(made, backlog)); err != nil {
			return err
		}
		n = len(made)
		_, err = tx.Exec(ctx, `UPDATE compute.webhook_fanout SET seq = $1`, *to)
		return err
	})
	return n, err
}

// FairShare is how many of a tenant's pending deliveries share a priority in the queue that
// every tenant's deliveries share.
const FairShare = 100

type madeDelivery struct {
	ID     int64
	Tenant string
}

// fairShare makes the jobs of a fan-out's deliveries (in log order) so that no tenant's flood
// holds back the others: River works its queue by priority first, and a delivery's priority
// falls by one (of River's four) for each FairShare of its tenant's deliveries before it,
// pending ones included. Within a priority the jobs are enqueued a round of each tenant at a
// time. A delivery's order among its subject's is kept by the worker, whatever the jobs' order.
func fairShare(made []madeDelivery, backlog map[string]int) []river.InsertManyParams {
	type ranked struct {
		madeDelivery
		rank int // the tenant's deliveries before it, pending ones included
	}
	rs := make([]ranked, len(made))
	seen := map[string]int{}
	for i, d := range made {
		rs[i] = ranked{d, backlog[d.Tenant] + seen[d.Tenant]}
		seen[d.Tenant]++
	}
	// Stable: a tenant's deliveries stay in log order within a rank.
	slices.SortStableFunc(rs, func(a, b ranked) int { return cmp.Compare(a.rank, b.rank) })
	params := make([]river.InsertManyParams, len(rs))
	for i, r := range rs {
		params[i] = river.InsertManyParams{Args: deliverArgs{Delivery: r.ID, Generation: 1},
			InsertOpts: &river.InsertOpts{Queue: Queue, MaxAttempts: maxAttempts, Priority: 1 + min(3, r.rank/FairShare)}}
	}
	return params
}

// fairOpts is the insert options of a lone job of a delivery (a wake-up, a redelivery): the
// priority fairShare would give it, its tenant's other pending deliveries all ahead of it (they
// were enqueued before), so that no way of enqueueing skips the queue's fairness.
func fairOpts(ctx context.Context, tx pgx.Tx, delivery int64) (*river.InsertOpts, error) {
	var ahead int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM compute.webhook_deliveries d JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id
		WHERE d.state = 'pending' AND d.id <> $1 AND w.tenant_id = (SELECT w2.tenant_id FROM compute.webhook_deliveries d2
			JOIN compute.webhook_endpoints w2 ON w2.id = d2.endpoint_id WHERE d2.id = $1)`, delivery).Scan(&ahead)
	if err != nil {
		return nil, err
	}
	return &river.InsertOpts{Queue: Queue, MaxAttempts: maxAttempts, Priority: 1 + min(3, ahead/FairShare)}, nil
}

var deliveryColumns = `d.id, d.endpoint_id::text, d.event_seq, e.type, d.subject, d.state, d.attempts, d.created_at,
	CASE WHEN d.state = 'pending' THEN d.next_attempt_at END, d.delivered_at,
	coalesce((SELECT jsonb_agg(jsonb_build_object('at', a.at, 'status', a.status, 'error', a.error, 'seconds', a.seconds) ORDER BY a.n DESC)
	          FROM (SELECT * FROM compute.webhook_attempts WHERE delivery_id = d.id ORDER BY n DESC LIMIT ` + strconv.Itoa(api.MaxListedAttempts) + `) a), '[]')`

func scanDelivery(row pgx.Row) (api.WebhookDelivery, error) {
	var d api.WebhookDelivery
	err := row.Scan(&d.ID, &d.WebhookID, &d.EventID, &d.EventType, &d.Subject, &d.State, &d.Attempts, &d.CreatedAt, &d.NextAttemptAt, &d.DeliveredAt, &d.LastAttempts)
	return d, err
}

const deliveryCursor = "whd1"

func deliveries(ctx context.Context, c *modules.Call, in api.ListWebhookDeliveries) (api.Page[api.WebhookDelivery], error) {
	var before *int64
	if in.Cursor != "" {
		key, err := api.DecodeCursor(deliveryCursor, in.Cursor)
		if err != nil {
			return api.Page[api.WebhookDelivery]{}, err
		}
		id, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			return api.Page[api.WebhookDelivery]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
		}
		before = &id
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+deliveryColumns+` FROM compute.webhook_deliveries d JOIN compute.events e ON e.seq = d.event_seq
		WHERE d.endpoint_id = $1 AND ($2::bigint IS NULL OR d.id < $2) AND ($3 = '' OR d.state = $3)
		  AND ($4::bigint = 0 OR d.event_seq = $4) AND ($5 = '' OR e.type = $5)
		ORDER BY d.id DESC LIMIT $6`, in.Webhook, before, in.State, in.EventID, in.EventType, limit+1)
	if err != nil {
		return api.Page[api.WebhookDelivery]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.WebhookDelivery, error) { return scanDelivery(r) })
	if err != nil {
		return api.Page[api.WebhookDelivery]{}, err
	}
	return api.PageOf(items, limit, deliveryCursor, func(d api.WebhookDelivery) string { return strconv.FormatInt(d.ID, 10) }), nil
}

func deliveryTarget(ctx context.Context, l modules.Lookup, in api.RedeliverWebhook) (modules.Target, error) {
	ref := strconv.FormatInt(in.Delivery, 10)
	t := modules.Target{Existing: true, Kind: "webhook delivery", Ref: ref}
	err := l.Q.QueryRow(ctx, `SELECT w.tenant_id, w.id::text FROM compute.webhook_deliveries d JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id
		WHERE d.id = $1`, in.Delivery).Scan(&t.TenantID, &t.ResourceID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("webhook delivery", ref)
	}
	return t, err
}

// redeliver makes a delivery pending again, due now, whatever its state, with a job of its next
// generation: the dead-letter age counts again from now.
func redeliver(ctx context.Context, c *modules.Call, in api.RedeliverWebhook) (api.WebhookDelivery, error) {
	var gen int
	err := c.Tx.QueryRow(ctx, `UPDATE compute.webhook_deliveries d SET state = 'pending', generation = generation + 1,
		due_at = compute.compute_now(), next_attempt_at = compute.compute_now(), delivered_at = NULL
		FROM compute.webhook_endpoints w WHERE d.id = $1 AND w.id = d.endpoint_id AND w.tenant_id = $2 RETURNING d.generation`,
		in.Delivery, c.Target.TenantID).Scan(&gen)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.WebhookDelivery{}, api.NotFound("webhook delivery", strconv.FormatInt(in.Delivery, 10))
	}
	if err != nil {
		return api.WebhookDelivery{}, err
	}
	opts, err := fairOpts(ctx, c.Tx, in.Delivery)
	if err != nil {
		return api.WebhookDelivery{}, err
	}
	if _, err := c.Runtime.Jobs.InsertTx(ctx, c.Tx, deliverArgs{Delivery: in.Delivery, Generation: gen}, opts); err != nil {
		return api.WebhookDelivery{}, err
	}
	return scanDelivery(c.Tx.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM compute.webhook_deliveries d JOIN compute.events e ON e.seq = d.event_seq WHERE d.id = $1`, in.Delivery))
}
