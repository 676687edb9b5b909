// Package webhooks sends a tenant's events to the HTTP endpoints it registers, signed the
// Standard Webhooks way (https://www.standardwebhooks.com): the fan-out gives every event of
// the log a delivery row per matching endpoint, in one transaction with the River jobs that
// attempt them; the jobs retry with backoff, keep each subject's events in order, and give up
// (dead) after a dead-letter age. The package alone writes the webhook_* tables.
package webhooks

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/metrics"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the webhooks' schema. It reads compute.events, so it is applied after the
// event log's.
var Migrations = postgres.EmbeddedMigrations("webhooks", "compute", migrationsFS)

// Queue is the River queue of delivery attempts.
const Queue = "webhooks"

// Defaults of Config.
const (
	DefaultTimeout          = 10 * time.Second
	DefaultMaxResponseBytes = 64 << 10
	DefaultRetryBase        = 5 * time.Second
	DefaultRetryMax         = time.Hour
	DefaultDeadAfter        = 72 * time.Hour
	DefaultFanoutEvery      = 250 * time.Millisecond
	// DefaultFanoutEveryWoken is FanoutEvery's default when Wake is set: the fan-out's
	// fallback for events sequenced by other processes.
	DefaultFanoutEveryWoken = 2 * time.Second
	DefaultWorkers          = 20
	DefaultMaxEndpoints     = 100
)

// Config tunes delivery. Zero values mean the defaults.
type Config struct {
	// Outbound is the outbound policy (compute.Options.Outbound): an endpoint's host is checked
	// at creation, and the address of every connection an attempt makes. nil: public
	// addresses only.
	Outbound         *netpolicy.Policy
	Timeout          time.Duration // one attempt, connection to the end of the answer's headers and body
	MaxResponseBytes int64         // of an answer's body, read and discarded
	RetryBase        time.Duration // the first retry's delay; each next one doubles it, ±20%
	RetryMax         time.Duration // the longest delay between attempts
	DeadAfter        time.Duration // a delivery still failing this long after it was due is dead
	FanoutEvery      time.Duration // how often new events are given their deliveries, at the least
	// MaxEndpoints bounds the endpoints of one tenant (DefaultMaxEndpoints when 0; negative: no
	// limit): each endpoint is a delivery of every event it matches, in the shared queue.
	MaxEndpoints int
	// Wake, when set, returns a channel closed when events were sequenced in this process: the
	// fan-out then runs at once, and otherwise only every FanoutEvery.
	Wake    func() <-chan struct{}
	Workers int // attempts one process makes at once
	Metrics *metrics.Metrics
}

// Module is the webhooks part of the core.
type Module struct {
	cfg    Config
	client *http.Client
}

// New checks cfg and fills its defaults.
func New(cfg Config) (*Module, error) {
	for name, d := range map[string]time.Duration{"Timeout": cfg.Timeout, "RetryBase": cfg.RetryBase, "RetryMax": cfg.RetryMax, "DeadAfter": cfg.DeadAfter, "FanoutEvery": cfg.FanoutEvery} {
		if d < 0 {
			return nil, fmt.Errorf("webhooks: %s must not be negative, got %s", name, d)
		}
	}
	if cfg.MaxResponseBytes < 0 || cfg.Workers < 0 {
		return nil, errors.New("webhooks: MaxResponseBytes and Workers must not be negative")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.Timeout, DefaultTimeout)
	def(&cfg.RetryBase, DefaultRetryBase)
	def(&cfg.RetryMax, DefaultRetryMax)
	def(&cfg.DeadAfter, DefaultDeadAfter)
	if cfg.Wake != nil {
		def(&cfg.FanoutEvery, DefaultFanoutEveryWoken)
	}
	def(&cfg.FanoutEvery, DefaultFanoutEvery)
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.MaxEndpoints == 0 {
		cfg.MaxEndpoints = DefaultMaxEndpoints
	}
	if cfg.RetryMax < cfg.RetryBase {
		return nil, fmt.Errorf("webhooks: RetryMax (%s) is shorter than RetryBase (%s)", cfg.RetryMax, cfg.RetryBase)
	}
	return &Module{cfg: cfg, client: newClient(cfg)}, nil
}

// Name implements modules.Module.
func (*Module) Name() string { return "webhooks" }

// The event types the package writes. Events of the webhook. prefix are never themselves sent
// to endpoints, except webhook.test to the endpoint it tests: a failing endpoint must not feed
// itself.
const (
	EventTest = "webhook.test"
	EventDead = "webhook.dead"
)

// Register implements modules.Module.
func (m *Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceWebhook, Description: "An endpoint a tenant's events are sent to, and its deliveries."})
	r.Actions(modules.ActionsFor(api.WebhookMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventTest, Description: "webhooks.test asked for a delivery to one endpoint, its subject (data: url)."},
		modules.EventType{Name: EventDead, Description: "A delivery was given up after the dead-letter age; its subject is the endpoint (data: delivery, eventId, attempts)."},
	)
	r.JobQueue(modules.JobQueue{Name: Queue, MaxWorkers: m.cfg.Workers, AddWorkers: func(w *river.Workers, rt *modules.Runtime) error {
		return river.AddWorkerSafely(w, &deliverer{m: m, rt: rt})
	}})
	r.Worker(modules.Worker{Name: "webhooks-fanout", Modes: []string{"worker"}, Run: m.fanout})
	modules.Handle(r, api.WebhooksCreate, nil, m.create)
	modules.Handle(r, api.WebhooksList, nil, list)
	modules.Handle(r, api.WebhooksDelete, endpointTarget, remove)
	modules.Handle(r, api.WebhooksTest, endpointTarget, test)
	modules.Handle(r, api.WebhooksRotateSecret, func(ctx context.Context, l modules.Lookup, in api.RotateWebhookSecret) (modules.Target, error) {
		return endpointTarget(ctx, l, api.WebhookRef{Webhook: in.Webhook})
	}, rotate)
	modules.Handle(r, api.WebhooksDeliveries, func(ctx context.Context, l modules.Lookup, in api.ListWebhookDeliveries) (modules.Target, error) {
		return endpointTarget(ctx, l, api.WebhookRef{Webhook: in.Webhook})
	}, deliveries)
	modules.Handle(r, api.WebhooksRedeliver, deliveryTarget, redeliver)
	return nil
}

// fanout is the fan-out worker: a round when the sequencer woke it, or every FanoutEvery.
func (m *Module) fanout(ctx context.Context, rt *modules.Runtime) error {
	return modules.EveryOrWoken(ctx, m.cfg.FanoutEvery, m.cfg.Wake, func() error {
		_, err := Fanout(ctx, rt.DB, rt.Jobs)
		return err
	})
}

const endpointColumns = `id::text, tenant_id, url, description, event_types, after_seq, created_by, created_at,
	CASE WHEN previous_until > compute.compute_now() THEN previous_until END`

func scanEndpoint(row pgx.Row) (api.Webhook, error) {
	var w api.Webhook
	err := row.Scan(&w.ID, &w.TenantID, &w.URL, &w.Description, &w.EventTypes, &w.After, &w.CreatedBy, &w.CreatedAt, &w.PreviousSecretUntil)
	return w, err
}

// newSecret returns a signing secret: whsec_ and the base64 of 32 random bytes, the key.
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return api.WebhookSecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// purpose binds an endpoint's sealed secrets to it.
func purpose(endpointID string) string { return "webhook:" + endpointID }

func (m *Module) create(ctx context.Context, c *modules.Call, in api.CreateWebhook) (api.Webhook, error) {
	if err := m.cfg.Outbound.CheckURL(in.URL); err != nil {
		return api.Webhook{}, api.InvalidField("url", "%v: webhooks go to public endpoints (an operator may allow a range: Options.Outbound.Allow)", err).
			With("reason", "refused_by_outbound_policy")
	}
	if err := m.underLimit(ctx, c); err != nil {
		return api.Webhook{}, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	secret := newSecret()
	sealed, err := c.Runtime.Secrets.Seal(purpose(id), []byte(secret))
	if err != nil {
		return api.Webhook{}, err
	}
	types := in.EventTypes
	if types == nil {
		types = []string{}
	}
	w, err := scanEndpoint(c.Tx.QueryRow(ctx, `INSERT INTO compute.webhook_endpoints (id, tenant_id, url, description, event_types, secret, after_seq, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, (SELECT coalesce(max(seq), 0) FROM compute.events), $7) RETURNING `+endpointColumns,
		id, c.Target.TenantID, in.URL, in.Description, types, sealed, c.Principal.ID))
	w.Secret = secret
	return w, err
}

// underLimit refuses an endpoint past the tenant's limit (Config.MaxEndpoints). Creations in a
// tenant take turns (a lock for the rest of the call's transaction), so racing ones cannot
// both see room for one.
func (m *Module) underLimit(ctx context.Context, c *modules.Call) error {
	if m.cfg.MaxEndpoints < 0 {
		return nil
	}
	if _, err := c.Tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('compute.webhook_endpoints:' || $1, 0))`, c.Target.TenantID); err != nil {
		return err
	}
	var n int
	if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.webhook_endpoints WHERE tenant_id = $1`, c.Target.TenantID).Scan(&n); err != nil {
		return err
	}
	if n >= m.cfg.MaxEndpoints {
		return api.Errorf(api.CodeQuotaExceeded, "tenant %s has %d webhook endpoints, its limit: delete one first (webhooks.delete)", c.Target.TenantID, n).
			With("reason", "too_many_endpoints").With("limit", m.cfg.MaxEndpoints)
	}
	return nil
}

const cursorKind = "wh1"

func list(ctx context.Context, c *modules.Call, in api.ListWebhooks) (api.Page[api.Webhook], error) {
	var after *string
	if in.Cursor != "" {
		key, err := api.DecodeCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.Webhook]{}, err
		}
		if uuid.Validate(key) != nil {
			return api.Page[api.Webhook]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
		}
		after = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+endpointColumns+` FROM compute.webhook_endpoints
		WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3`, c.Target.TenantID, after, limit+1)
	if err != nil {
		return api.Page[api.Webhook]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Webhook, error) { return scanEndpoint(r) })
	if err != nil {
		return api.Page[api.Webhook]{}, err
	}
	return api.PageOf(items, limit, cursorKind, func(w api.Webhook) string { return w.ID }), nil
}

func endpointTarget(ctx context.Context, l modules.Lookup, in api.WebhookRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "webhook", Ref: in.Webhook, ResourceID: in.Webhook}
	if uuid.Validate(in.Webhook) != nil {
		return t, api.InvalidField("webhook", "%q is not a webhook's id (webhooks.list)", in.Webhook)
	}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.webhook_endpoints WHERE id = $1`, in.Webhook).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("webhook", in.Webhook)
	}
	return t, err
}

// one reads the endpoint a call's target found, in its transaction: gone since, it is not found.
func one(row pgx.Row, ref string) (api.Webhook, error) {
	w, err := scanEndpoint(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return w, api.NotFound("webhook", ref)
	}
	return w, err
}

func remove(ctx context.Context, c *modules.Call, in api.WebhookRef) (api.Webhook, error) {
	// Its deliveries go with it; their jobs find nothing and stand down.
	return one(c.Tx.QueryRow(ctx, `DELETE FROM compute.webhook_endpoints WHERE id = $1 AND tenant_id = $2 RETURNING `+endpointColumns,
		in.Webhook, c.Target.TenantID), in.Webhook)
}

func test(ctx context.Context, c *modules.Call, in api.WebhookRef) (api.WebhookTest, error) {
	w, err := one(c.Tx.QueryRow(ctx, `SELECT `+endpointColumns+` FROM compute.webhook_endpoints WHERE id = $1 AND tenant_id = $2`,
		in.Webhook, c.Target.TenantID), in.Webhook)
	if err != nil {
		return api.WebhookTest{}, err
	}
	err = c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventTest, TenantID: w.TenantID, Subject: w.ID, Data: map[string]any{"url": w.URL}})
	return api.WebhookTest{WebhookID: w.ID, EventType: EventTest}, err
}

func rotate(ctx context.Context, c *modules.Call, in api.RotateWebhookSecret) (api.Webhook, error) {
	keep, err := in.KeepFor()
	if err != nil {
		return api.Webhook{}, err
	}
	secret := newSecret()
	sealed, err := c.Runtime.Secrets.Seal(purpose(in.Webhook), []byte(secret))
	if err != nil {
		return api.Webhook{}, err
	}
	w, err := one(c.Tx.QueryRow(ctx, `UPDATE compute.webhook_endpoints SET previous_secret = secret, secret = $3,
		previous_until = CASE WHEN $4 > 0 THEN compute.compute_now() + make_interval(secs => $4) END
		WHERE id = $1 AND tenant_id = $2 RETURNING `+endpointColumns,
		in.Webhook, c.Target.TenantID, sealed, keep.Seconds()), in.Webhook)
	w.Secret = secret
	return w, err
}

// UpdateEndpoint sets an endpoint's description and event types in tx, keeping its URL, its
// secrets and its deliveries: what fleet.apply does to an endpoint its document lists with other
// fields (docs/fleet.md). An endpoint of no such id in tenant is not found.
func UpdateEndpoint(ctx context.Context, tx pgx.Tx, tenant, id, description string, eventTypes []string) (api.Webhook, error) {
	if eventTypes == nil {
		eventTypes = []string{}
	}
	return one(tx.QueryRow(ctx, `UPDATE compute.webhook_endpoints SET description = $3, event_types = $4
		WHERE id = $1 AND tenant_id = $2 RETURNING `+endpointColumns, id, tenant, description, eventTypes), id)
}
