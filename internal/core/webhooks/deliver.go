package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/tidwall/gjson"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/jobs"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
)

// deliverer works delivery jobs: one attempt each.
type deliverer struct {
	river.WorkerDefaults[deliverArgs]
	m  *Module
	rt *modules.Runtime
}

// Bookkeeping is the time an attempt's job is given beyond the attempt's Timeout, to record it.
const Bookkeeping = 5 * time.Second

// Timeout bounds an attempt with its bookkeeping.
func (w *deliverer) Timeout(*river.Job[deliverArgs]) time.Duration {
	return w.m.cfg.Timeout + Bookkeeping
}

// NextRetry is the backoff of the attempt that failed, the same one Work recorded.
func (w *deliverer) NextRetry(j *river.Job[deliverArgs]) time.Time {
	return time.Now().Add(w.m.backoff(j.ID, j.Attempt))
}

// backoff is the delay after a job's attempt-th failed attempt: RetryBase doubled per attempt
// up to RetryMax, with the job's own jitter (jobs.Backoff), so that Work and NextRetry agree.
func (m *Module) backoff(jobID int64, attempt int) time.Duration {
	return jobs.Backoff(m.cfg.RetryBase, m.cfg.RetryMax, jobID, attempt)
}

// delivery is what an attempt reads.
type delivery struct {
	state      string
	generation int
	attempts   int
	subject    string
	dueAt, now time.Time
	endpoint   string
	url        string
	secret     []byte
	previous   []byte // nil unless still signing
	event      api.Event
}

func (w *deliverer) Work(ctx context.Context, j *river.Job[deliverArgs]) error {
	db := w.rt.DB.Pool
	var d delivery
	err := db.QueryRow(ctx, `SELECT d.state, d.generation, d.attempts, d.subject, d.due_at, compute.compute_now(),
			w.id::text, w.url, w.secret, CASE WHEN w.previous_until > compute.compute_now() THEN w.previous_secret END,
			e.seq, e.type, e.tenant_id, e.subject, e.data, e.created_at
		FROM compute.webhook_deliveries d JOIN compute.webhook_endpoints w ON w.id = d.endpoint_id JOIN compute.events e ON e.seq = d.event_seq
		WHERE d.id = $1`, j.Args.Delivery).Scan(&d.state, &d.generation, &d.attempts, &d.subject, &d.dueAt, &d.now,
		&d.endpoint, &d.url, &d.secret, &d.previous,
		&d.event.ID, &d.event.Type, &d.event.TenantID, &d.event.Subject, &d.event.Data, &d.event.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // its endpoint was deleted
	}
	if err != nil {
		return err
	}
	if d.state != api.DeliveryPending || d.generation != j.Args.Generation {
		return nil // delivered, dead, or redelivered by a newer job
	}
	// Order per subject: the endpoint hears of a subject's events in log order, so this one waits
	// for those before it.
	var blocker *time.Time
	err = db.QueryRow(ctx, `SELECT next_attempt_at FROM compute.webhook_deliveries
		WHERE endpoint_id = $1 AND subject = $2 AND state = 'pending' AND event_seq < $3 ORDER BY event_seq LIMIT 1`,
		d.endpoint, d.subject, d.event.ID).Scan(&blocker)
	switch {
	case err == nil:
		return river.JobSnooze(waitFor(blocker, d.now, gjson.GetBytes(j.Metadata, "snoozes").Int()))
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	if d.now.Sub(d.dueAt) > w.m.cfg.DeadAfter || j.Attempt >= j.MaxAttempts {
		return w.dead(ctx, j, d)
	}
	// One attempt at a time: a delivery may have two jobs (a successor woken by the one before
	// it, beside its own), and only the one that claims it sends.
	tag, err := db.Exec(ctx, `UPDATE compute.webhook_deliveries SET claimed_until = compute.compute_now() + make_interval(secs => $3)
		WHERE id = $1 AND generation = $2 AND state = 'pending' AND (claimed_until IS NULL OR claimed_until <= compute.compute_now())`,
		j.Args.Delivery, j.Args.Generation, w.Timeout(j).Seconds())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return river.JobSnooze(time.Second) // another job's attempt is in flight
	}
	keys, err := w.keys(d)
	if err != nil {
		return err
	}
	at := time.Now()
	status, why, detail := w.m.attempt(ctx, d, keys)
	took := time.Since(at)
	ok := why == ""
	next := d.now.Add(w.m.backoff(j.ID, j.Attempt))
	err = w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE compute.webhook_deliveries SET attempts = attempts + 1, claimed_until = NULL,
			state = CASE WHEN $3 THEN 'delivered' ELSE state END,
			delivered_at = CASE WHEN $3 THEN compute.compute_now() END,
			next_attempt_at = CASE WHEN $3 THEN NULL ELSE $4::timestamptz END
			WHERE id = $1 AND generation = $2 AND state = 'pending'`, j.Args.Delivery, j.Args.Generation, ok, next)
		if err != nil || tag.RowsAffected() == 0 {
			return err // redelivered meanwhile: the newer job records its own
		}
		if _, err := tx.Exec(ctx, `INSERT INTO compute.webhook_attempts (delivery_id, n, at, status, error, seconds)
			VALUES ($1, $2, $3, $4, $5, $6)`, j.Args.Delivery, d.attempts+1, at, status, why, took.Seconds()); err != nil {
			return err
		}
		if ok {
			return w.wakeNext(ctx, tx, d)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("webhooks: record delivery %d: %w", j.Args.Delivery, err)
	}
	if ok {
		w.m.cfg.Metrics.WebhookAttempt("delivered", took)
		return nil
	}
	w.m.cfg.Metrics.WebhookAttempt("failed", took)
	if detail != nil { // the operator's, in River's record of the job
		return fmt.Errorf("webhooks: delivery %d to %s: %s: %w", j.Args.Delivery, d.url, why, detail)
	}
	return fmt.Errorf("webhooks: delivery %d to %s: %s", j.Args.Delivery, d.url, why)
}

// wakeNext enqueues a job for the next pending delivery of d's subject, in tx: it waited for
// d, and its own job may be snoozed for a while yet.
func (w *deliverer) wakeNext(ctx context.Context, tx pgx.Tx, d delivery) error {
	var next deliverArgs
	err := tx.QueryRow(ctx, `SELECT id, generation FROM compute.webhook_deliveries
		WHERE endpoint_id = $1 AND subject = $2 AND state = 'pending' AND event_seq > $3 ORDER BY event_seq LIMIT 1`,
		d.endpoint, d.subject, d.event.ID).Scan(&next.Delivery, &next.Generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	opts, err := fairOpts(ctx, tx, next.Delivery)
	if err != nil {
		return err
	}
	_, err = w.rt.Jobs.InsertTx(ctx, tx, next, opts)
	return err
}

// waitFor is how long a delivery waits behind an earlier pending one of its subject: until
// that one's next attempt when it is ahead, else a little longer each time it found it
// still pending, up to 30 s: the one before it wakes it when it is delivered or dead, so
// waiting longer costs nothing, and a long queue behind a failing endpoint does not poll.
func waitFor(blockerNext *time.Time, now time.Time, snoozes int64) time.Duration {
	if blockerNext != nil && blockerNext.After(now) {
		return min(blockerNext.Sub(now)+100*time.Millisecond, time.Minute)
	}
	return min(50*time.Millisecond<<min(snoozes, 10), 30*time.Second)
}

// dead gives a delivery up, with an event about its endpoint.
func (w *deliverer) dead(ctx context.Context, j *river.Job[deliverArgs], d delivery) error {
	err := w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE compute.webhook_deliveries SET state = 'dead', next_attempt_at = NULL
			WHERE id = $1 AND generation = $2 AND state = 'pending'`, j.Args.Delivery, j.Args.Generation)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if err := w.rt.Events.Emit(ctx, tx, modules.Event{Type: EventDead, TenantID: d.event.TenantID, Subject: d.endpoint,
			Data: map[string]any{"delivery": j.Args.Delivery, "eventId": d.event.ID, "attempts": d.attempts}}); err != nil {
			return err
		}
		return w.wakeNext(ctx, tx, d)
	})
	if err == nil {
		w.m.cfg.Metrics.WebhookAttempt("dead", 0)
	}
	return err
}

// keys are the signing keys of a delivery's endpoint: its secret's, and the previous one's while
// it still signs.
func (w *deliverer) keys(d delivery) ([][]byte, error) {
	sealed := [][]byte{d.secret}
	if d.previous != nil {
		sealed = append(sealed, d.previous)
	}
	keys := make([][]byte, 0, len(sealed))
	for _, s := range sealed {
		secret, err := w.rt.Secrets.Open(purpose(d.endpoint), s)
		if err != nil {
			return nil, fmt.Errorf("open the endpoint's secret: %w", err)
		}
		k, err := keyOf(string(secret))
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// attempt sends the event once, signed with keys. It returns the answer's status (0 without
// one), why the attempt failed as the tenant reads it ("" when the endpoint answered 2xx), and
// the error behind a failure without an answer, for the operator's log.
func (m *Module) attempt(ctx context.Context, d delivery, keys [][]byte) (int, string, error) {
	body, err := json.Marshal(d.event)
	if err != nil {
		return 0, err.Error(), err
	}
	id := "evt_" + strconv.FormatInt(d.event.ID, 10)
	ts := time.Now().Unix()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return 0, "the endpoint's URL cannot be requested", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "better-compute-webhooks/1")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", Sign(keys, id, ts, body))
	resp, err := m.client.Do(req)
	if err != nil {
		// What the tenant reads is what failed, never the error's text: it may name the
		// resolver's address, or the address a name resolved to (netpolicy.Describe).
		return 0, netpolicy.Describe(err), err
	}
	defer resp.Body.Close()
	// The answer's body is read (so the connection may be reused) and dropped, up to a bound:
	// a failed attempt records its status alone, never the body, which may be any service's.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, m.cfg.MaxResponseBytes))
	if resp.StatusCode/100 == 2 {
		return resp.StatusCode, "", nil
	}
	return resp.StatusCode, "HTTP " + strconv.Itoa(resp.StatusCode), nil
}

// Sign is the webhook-signature header of a message: "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>" under each key (the base64-decoded part of a whsec_ secret), separated by
// spaces.
func Sign(keys [][]byte, id string, ts int64, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		mac := hmac.New(sha256.New, k)
		fmt.Fprintf(mac, "%s.%d.", id, ts)
		mac.Write(body)
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	}
	return strings.Join(sigs, " ")
}

// keyOf is the signing key of a whsec_ secret.
func keyOf(secret string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, api.WebhookSecretPrefix))
	if err != nil || !strings.HasPrefix(secret, api.WebhookSecretPrefix) {
		return nil, errors.New("webhooks: a stored secret is not a whsec_ secret")
	}
	return k, nil
}

// newClient is the HTTP client of deliveries, through the outbound policy's transport (no
// proxy; every connection's address checked, after resolution), following no redirect (a 3xx is
// a failed attempt), bounded in time.
func newClient(cfg Config) *http.Client {
	t := cfg.Outbound.Transport()
	t.DialContext = cfg.Outbound.Dialer(cfg.Timeout).DialContext
	t.TLSHandshakeTimeout = cfg.Timeout
	t.ResponseHeaderTimeout = cfg.Timeout
	return &http.Client{
		Timeout:       cfg.Timeout,
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
