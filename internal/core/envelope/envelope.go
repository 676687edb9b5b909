// Package envelope runs every API call the same way, whether it came over HTTP or in-process:
// authenticate the credential → tenant pre-check → one IAM decision (mutations; reads may use a
// short cache) → one transaction → a typed result or a typed error.
package envelope

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/metrics"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the envelope's schema (idempotency keys).
var Migrations = postgres.EmbeddedMigrations("envelope", "compute", migrationsFS)

// Defaults.
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultIdempotencyTTL = 24 * time.Hour
)

// Config configures an Envelope.
type Config struct {
	Registry     *modules.Registry
	Runtime      *modules.Runtime
	Cache        *iam.DecisionCache // nil: no cache
	MaxBodyBytes int64              // 0: DefaultMaxBodyBytes
	Metrics      *metrics.Metrics   // nil: none recorded
}

// Envelope dispatches API calls.
type Envelope struct {
	batch   batchers
	reg     *modules.Registry
	rt      *modules.Runtime
	cache   *iam.DecisionCache
	maxBody int64
	log     *slog.Logger
	metrics *metrics.Metrics
	table   []api.MethodDescription // what GET /methods answers
}

// New returns an envelope over a checked registry. It refuses a method whose input has no JSON
// schema (the method table describes every input).
func New(cfg Config) (*Envelope, error) {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	e := &Envelope{reg: cfg.Registry, rt: cfg.Runtime, cache: cfg.Cache, maxBody: cfg.MaxBodyBytes, log: cfg.Runtime.Logger, metrics: cfg.Metrics}
	for _, h := range cfg.Registry.Handlers() {
		s, err := modules.InputSchema(h.InputType())
		if err != nil {
			return nil, fmt.Errorf("envelope: method %s: %w", h.Info.FullName(), err)
		}
		b, err := json.Marshal(s)
		if err != nil {
			return nil, fmt.Errorf("envelope: method %s: %w", h.Info.FullName(), err)
		}
		e.table = append(e.table, api.MethodDescription{MethodInfo: h.Info, InputSchema: b})
	}
	return e, nil
}

// Result is the answer of a call: Value, or Replay when an idempotency key repeated an earlier
// call (the first answer, as stored JSON).
type Result struct {
	Value  any
	Replay []byte
}

// Invoke runs one call of h with a decoded input.
func (e *Envelope) Invoke(ctx context.Context, credential string, h *modules.Handler, in any) (res Result, err error) {
	defer e.observe(h, time.Now(), &err)
	if !h.Accepts(in) {
		return Result{}, api.Errorf(api.CodeInternal, "method %s called with input of type %T", h.Info.FullName(), in)
	}
	p, err := e.authenticate(ctx, credential)
	if err != nil {
		return Result{}, err
	}
	return e.invoke(ctx, p, h, in)
}

// InvokeTx runs one call of h inside the host's transaction tx, so that what the call writes
// commits or rolls back with the host's own rows. The steps are Invoke's (authentication,
// validation, the tenant pre-check, one IAM decision), then the method runs in a savepoint of tx:
// a deadlock or serialization failure rolls back to it and runs the method again, leaving the
// host's earlier work in place; any other failure rolls back to it too, so tx stays usable.
// A method that batches runs alone here. tx must be READ COMMITTED: placement relies on each
// statement seeing what committed before it.
//
// The IAM decision is made while tx is open: an IAM port that needs a connection of the same pool
// then needs a second one. Size the pool for it.
func (e *Envelope) InvokeTx(ctx context.Context, tx pgx.Tx, credential string, h *modules.Handler, in any) (res Result, err error) {
	defer e.observe(h, time.Now(), &err)
	if tx == nil {
		return Result{}, api.Errorf(api.CodeInvalidArgument, "%s: InvokeTx needs the host's transaction (got nil)", h.Info.FullName())
	}
	if !h.Accepts(in) {
		return Result{}, api.Errorf(api.CodeInternal, "method %s called with input of type %T", h.Info.FullName(), in)
	}
	p, err := e.authenticate(ctx, credential)
	if err != nil {
		return Result{}, err
	}
	defer func() {
		if r := recover(); r != nil {
			res, err = Result{}, e.mapError(ctx, h, panicked(r))
		}
	}()
	target, key, hash, err := e.admit(ctx, p, h, in)
	if err != nil {
		return Result{}, err
	}
	var level string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil {
		return Result{}, e.mapError(ctx, h, err)
	}
	if level != "read committed" {
		return Result{}, &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("%s: InvokeTx needs a READ COMMITTED transaction, not %s", h.Info.FullName(), level),
			Details: map[string]any{"reason": "isolation", "isolation": level}}
	}
	savepoint := func(fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, tx, fn) }
	return e.retried(ctx, savepoint, p, h, target, key, hash, in)
}

func (e *Envelope) authenticate(ctx context.Context, credential string) (iam.Principal, error) {
	if credential == "" {
		return iam.Principal{}, &api.Error{Code: api.CodeUnauthenticated, Message: "no credential: send Authorization: Bearer <API key>",
			Details: map[string]any{"reason": "missing_credential"}}
	}
	if api.CheckString("credential", credential) != nil {
		return iam.Principal{}, &api.Error{Code: api.CodeUnauthenticated, Message: "the credential is not valid UTF-8 text without NUL bytes",
			Details: map[string]any{"reason": "invalid_credential"}}
	}
	p, err := e.rt.IAM.Authenticate(ctx, credential)
	switch {
	case errors.Is(err, iam.ErrUnauthenticated):
		// The code says unauthenticated: the message is what the port said after it (it was
		// "unauthenticated: unauthenticated: malformed token" once a client put the code first).
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), iam.ErrUnauthenticated.Error()), ": ")
		if msg == "" {
			msg = "the credential is not valid: malformed, unknown, expired or revoked"
		}
		return iam.Principal{}, &api.Error{Code: api.CodeUnauthenticated, Message: msg,
			Details: map[string]any{"reason": "invalid_credential"}}
	case err != nil:
		return iam.Principal{}, e.unavailable(ctx, "authenticate", err)
	}
	return p, nil
}

func (e *Envelope) invoke(ctx context.Context, p iam.Principal, h *modules.Handler, in any) (res Result, err error) {
	// A method that panics answers internal: it must not take an in-process host down with it.
	// (Inside a transaction, pgx has rolled it back by the time this runs.)
	defer func() {
		if r := recover(); r != nil {
			res, err = Result{}, e.mapError(ctx, h, panicked(r))
		}
	}()
	target, key, hash, err := e.admit(ctx, p, h, in)
	if err != nil {
		return Result{}, err
	}
	if bkey := h.BatchKey(target, in); bkey != "" {
		res, err = e.batched(ctx, h, bkey, &pending{ctx: ctx, p: p, t: target, key: key, hash: hash, in: in})
	} else {
		res, err = e.transactAlone(ctx, p, h, target, key, hash, in)
	}
	if api.CodeOf(err) == api.CodeQuotaExceeded {
		e.quotaExceeded(ctx, p, h, target, err)
	}
	return res, err
}

// confirmed records a call a person confirmed as an action.confirmed event, its subject the
// confirmation. The confirmation is spent whether the call then succeeds or not, so the event is
// written on its own, as the IAM port's consumption was.
func (e *Envelope) confirmed(ctx context.Context, p iam.Principal, req iam.Request, confirmation string) {
	data := map[string]any{"method": req.Method, "action": req.Action, "resource": req.Resource.String(), "principal": p.ID}
	if err := events.Emit(context.WithoutCancel(ctx), e.rt.DB.Pool, "action.confirmed", req.TenantID, confirmation, data); err != nil {
		e.log.WarnContext(ctx, "compute: record a confirmed call", "method", req.Method, "error", err)
	}
}

// quotaExceeded records a call refused over a quota as a quota.exceeded event. The call's own
// transaction was rolled back, so the event is written on its own: the refusal happened, and an
// operator watching the log should see a tenant pressing against its limits.
func (e *Envelope) quotaExceeded(ctx context.Context, p iam.Principal, h *modules.Handler, t modules.Target, err error) {
	var ae *api.Error
	errors.As(err, &ae)
	data := map[string]any{"method": h.Info.FullName(), "principal": p.ID, "message": ae.Message}
	for k, v := range ae.Details {
		data[k] = v
	}
	if err := events.Emit(context.WithoutCancel(ctx), e.rt.DB.Pool, "quota.exceeded", t.TenantID, t.TenantID, data); err != nil {
		e.log.WarnContext(ctx, "compute: record a quota refusal", "method", h.Info.FullName(), "error", err)
	}
}

// admit takes a call from its input to an allowed target: validation, the idempotency key, the
// target lookup, the tenant pre-check and the IAM decision. It returns the key and the hash of
// the input it is bound to.
func (e *Envelope) admit(ctx context.Context, p iam.Principal, h *modules.Handler, in any) (modules.Target, string, []byte, error) {
	if err := api.CheckInput(in); err != nil {
		return modules.Target{}, "", nil, err
	}
	if v, ok := in.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return modules.Target{}, "", nil, asAPIError(err)
		}
	}
	key := api.IdempotencyKey(ctx)
	if key != "" && !h.Info.Mutating {
		key = "" // a read has nothing to repeat
	}
	if err := api.ValidateIdempotencyKey(key); err != nil {
		return modules.Target{}, "", nil, err
	}
	target, err := h.Target(ctx, modules.Lookup{Q: e.rt.DB.Pool, Principal: p, IAM: e.rt.IAM}, in)
	if err != nil {
		return modules.Target{}, "", nil, e.mapError(ctx, h, err)
	}
	if err := e.precheck(ctx, p, &target); err != nil {
		return modules.Target{}, "", nil, err
	}
	if err := e.decide(ctx, p, h, target, in); err != nil {
		return modules.Target{}, "", nil, err
	}
	var hash []byte
	if key != "" {
		b, err := json.Marshal(in)
		if err != nil {
			return modules.Target{}, "", nil, api.Errorf(api.CodeInternal, "hash input: %v", err)
		}
		sum := sha256.Sum256(b)
		hash = sum[:]
	}
	return target, key, hash, nil
}

// precheck refuses, before IAM is asked, a target outside the caller's tenant and its descendants.
// It records the target tenant's path on t, for the call's transaction to use instead of IAM.
func (e *Envelope) precheck(ctx context.Context, p iam.Principal, t *modules.Target) error {
	path, err := e.rt.IAM.TenantPath(ctx, t.TenantID)
	if err != nil {
		return e.unavailable(ctx, "tenant pre-check", err)
	}
	t.TenantPath = path
	if slices.Contains(path, p.TenantID) {
		return nil
	}
	if t.Existing {
		return api.NotFound(t.Kind, t.Ref)
	}
	return &api.Error{Code: api.CodePermissionDenied,
		Message: fmt.Sprintf("tenant %q is not %s or one of its descendants", t.TenantID, p.TenantID),
		Details: map[string]any{"reason": "tenant", "tenantId": t.TenantID}}
}

func (e *Envelope) decide(ctx context.Context, p iam.Principal, h *modules.Handler, t modules.Target, in any) error {
	req := iam.Request{TenantID: t.TenantID, Action: h.Info.Action, Resource: iam.Resource{Type: h.Info.Resource, ID: t.ResourceID}}
	if p.Kind == iam.KindAgent {
		// Only an agent's decision may need a confirmation, which is of this one call.
		input, err := iam.CanonicalInput(in)
		if err != nil {
			return api.Errorf(api.CodeInternal, "canonical input of %s: %v", h.Info.FullName(), err)
		}
		req.Method, req.Input = h.Info.FullName(), input
	}
	authorize := func() (iam.Decision, error) {
		start := time.Now()
		d, err := e.rt.IAM.Authorize(ctx, p, req)
		e.metrics.IAMDecision(decisionOutcome(d, err), time.Since(start))
		return d, err
	}
	var d iam.Decision
	var err error
	if h.Info.Mutating {
		d, err = authorize()
	} else {
		d, err = e.cache.Decide(p, req, authorize)
	}
	if err != nil {
		return e.unavailable(ctx, "authorize", err)
	}
	if d.Allowed {
		if d.Confirmed != "" {
			e.confirmed(ctx, p, req, d.Confirmed)
		}
		return nil
	}
	if d.ConfirmationRequired {
		c, err := e.rt.IAM.RequestConfirmation(ctx, p, req)
		if err != nil {
			return e.unavailable(ctx, "request a confirmation", err)
		}
		return &api.Error{Code: api.CodeConfirmationRequired,
			Message: fmt.Sprintf("%s on %s needs a person's confirmation of this very call: ask them to approve confirmation %s before %s, then make the same call again",
				req.Action, req.Resource, c.ID, c.ExpiresAt.UTC().Format(time.RFC3339)),
			Details: map[string]any{"confirmationId": c.ID, "action": req.Action, "resource": req.Resource.String(), "tenantId": req.TenantID,
				"method": req.Method, "expiresAt": c.ExpiresAt}}
	}
	return &api.Error{Code: api.CodePermissionDenied,
		Message: fmt.Sprintf("%s on %s in tenant %s is not allowed: %s", req.Action, req.Resource, req.TenantID, d.Reason),
		Details: map[string]any{"action": req.Action, "resource": req.Resource.String(), "tenantId": req.TenantID, "reason": d.Reason}}
}

// decisionOutcome names an IAM decision for its metric.
func decisionOutcome(d iam.Decision, err error) string {
	switch {
	case err != nil:
		return "error"
	case d.Allowed:
		return "allowed"
	case d.ConfirmationRequired:
		return "confirmation_required"
	}
	return "denied"
}

// observe records a call of h that began at start and ended with *err.
func (e *Envelope) observe(h *modules.Handler, start time.Time, err *error) {
	if e.metrics == nil {
		return
	}
	code := "ok"
	if *err != nil {
		code = string(asAPIError(*err).Code)
	}
	e.metrics.APICall(h.Info.FullName(), code, time.Since(start))
}

// transactAlone runs one call in one transaction, retried when PostgreSQL reports a deadlock or
// a serialization failure, or the method asks for it (modules.ErrRetry): all safe to retry.
func (e *Envelope) transactAlone(ctx context.Context, p iam.Principal, h *modules.Handler, t modules.Target, key string, hash []byte, in any) (Result, error) {
	opts := pgx.TxOptions{}
	if !h.Info.Mutating {
		opts.AccessMode = pgx.ReadOnly
	}
	begin := func(fn func(pgx.Tx) error) error { return pgx.BeginTxFunc(ctx, e.rt.DB.Pool, opts, fn) }
	return e.retried(ctx, begin, p, h, t, key, hash, in)
}

// retried runs the call in a transaction begin makes, and again in a new one while the database
// reports a deadlock or serialization failure or the method asks (modules.ErrRetry), up to
// maxAttempts runs with jittered backoff between them.
func (e *Envelope) retried(ctx context.Context, begin func(func(pgx.Tx) error) error, p iam.Principal, h *modules.Handler, t modules.Target, key string, hash []byte, in any) (Result, error) {
	for attempt := 1; ; attempt++ {
		var res Result
		err := begin(func(tx pgx.Tx) error {
			var err error
			res, err = e.run(ctx, tx, p, h, t, key, hash, in)
			return err
		})
		if err == nil {
			return res, nil
		}
		if !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			return Result{}, e.mapError(ctx, h, err)
		}
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return Result{}, e.mapError(ctx, h, err)
		}
	}
}

// run runs the method in tx, with its idempotency key claimed (or its earlier answer found) and
// its answer stored in the same transaction.
func (e *Envelope) run(ctx context.Context, tx pgx.Tx, p iam.Principal, h *modules.Handler, t modules.Target, key string, hash []byte, in any) (Result, error) {
	if key != "" {
		replay, found, err := claimKey(ctx, tx, p.ID, h.Info.FullName(), key, hash)
		if err != nil || found {
			return Result{Replay: replay}, err
		}
	}
	out, err := safely(func() (any, error) {
		return h.Run(ctx, &modules.Call{Principal: p, Target: t, Tx: tx, Runtime: e.rt}, in)
	})
	if err != nil {
		return Result{}, err
	}
	if key != "" {
		if err := storeResponse(ctx, tx, p.ID, h.Info.FullName(), key, out); err != nil {
			return Result{}, err
		}
	}
	return Result{Value: out}, nil
}

// maxAttempts bounds the runs of a call the database keeps refereeing against it. Past it the
// call answers unavailable (contention), never internal.
const maxAttempts = 8

// retryable reports a failure after which the whole transaction may run again: the database
// undid it (a deadlock, a serialization failure), the method asked (modules.ErrRetry), or the
// connection failed before anything was sent.
func retryable(err error) bool {
	return postgres.Retryable(err) || errors.Is(err, modules.ErrRetry) ||
		(postgres.Unavailable(err) && pgconn.SafeToRetry(err))
}

// backoff is the wait before run attempt+1: exponential from 2 ms to 250 ms, with full jitter
// so that the calls a deadlock set against each other do not meet again.
func backoff(attempt int) time.Duration {
	d := min(2*time.Millisecond<<attempt, 250*time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// panicError is a method's panic, turned into an error with where it happened.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v\n%s", p.value, p.stack) }

func panicked(r any) error { return &panicError{value: r, stack: debug.Stack()} }

// safely runs a method's code, turning its panic into an error: the transaction around it rolls
// back as for any error, and a batch's leader goes on to answer the other calls.
func safely[T any](fn func() (T, error)) (out T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicked(r)
		}
	}()
	return fn()
}

// storeResponse records the answer a replay of key gets. An answer carrying a secret shown once
// (a join token) says what to keep instead through ForReplay.
func storeResponse(ctx context.Context, tx pgx.Tx, principal, method, key string, out any) error {
	if r, ok := out.(interface{ ForReplay() any }); ok {
		out = r.ForReplay()
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE compute.idempotency_keys SET response = $4
		WHERE principal_id = $1 AND method = $2 AND key = $3`, principal, method, key, b)
	return err
}

func isAPIError(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}

// claimKey records key for this call, or, found, returns the answer an earlier call with it
// committed (nil if that call is in this very transaction). A concurrent call with the same key
// waits on the row until the first commits or rolls back.
func claimKey(ctx context.Context, tx pgx.Tx, principal, method, key string, hash []byte) (replay []byte, found bool, err error) {
	tag, err := tx.Exec(ctx, `INSERT INTO compute.idempotency_keys (principal_id, method, key, request_hash)
		VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, principal, method, key, hash)
	if err != nil || tag.RowsAffected() == 1 {
		return nil, false, err
	}
	var stored, response []byte
	if err := tx.QueryRow(ctx, `SELECT request_hash, response FROM compute.idempotency_keys
		WHERE principal_id = $1 AND method = $2 AND key = $3`, principal, method, key).Scan(&stored, &response); err != nil {
		return nil, true, err
	}
	if !bytes.Equal(stored, hash) {
		return nil, true, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("idempotency key %q was already used for %s with a different input", key, method),
			Details: map[string]any{"reason": "idempotency_key_reused"}}
	}
	return response, true, nil
}

// mapError turns what a handler returned into an *api.Error. Constraint violations that a
// handler did not map itself get the code that fits them; anything else is internal, logged
// with its detail and answered without it.
func (e *Envelope) mapError(ctx context.Context, h *modules.Handler, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &api.Error{Code: api.CodeUnavailable, Message: "the call was cancelled or ran out of time: " + err.Error()}
	}
	if postgres.Unavailable(err) {
		// The error's text may name the database's host and user: it goes to the log only.
		e.logger(ctx).WarnContext(ctx, "compute: database unavailable", "method", h.Info.FullName(), "error", err)
		return &api.Error{Code: api.CodeUnavailable, Message: "the database is unavailable; try again shortly",
			Details: map[string]any{"reason": "database_unavailable"}}
	}
	if postgres.Retryable(err) || errors.Is(err, modules.ErrRetry) {
		e.logger(ctx).WarnContext(ctx, "compute: contention", "method", h.Info.FullName(), "error", err)
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("%s met concurrent calls %d times in a row; try again", h.Info.FullName(), maxAttempts),
			Details: map[string]any{"reason": "contention"}}
	}
	switch postgres.ErrorCode(err) {
	case postgres.UniqueViolation, postgres.ExclusionViolation:
		return &api.Error{Code: api.CodeConflict, Message: "conflicts with an existing record",
			Details: map[string]any{"constraint": postgres.Constraint(err)}}
	case postgres.ForeignKeyViolation:
		return &api.Error{Code: api.CodeFailedPrecondition, Message: "refers to, or is referred to by, another record",
			Details: map[string]any{"constraint": postgres.Constraint(err)}}
	case postgres.CheckViolation:
		return &api.Error{Code: api.CodeInvalidArgument, Message: "a value is outside what is allowed",
			Details: map[string]any{"constraint": postgres.Constraint(err)}}
	}
	e.logger(ctx).ErrorContext(ctx, "compute: internal error", "method", h.Info.FullName(), "error", err)
	return &api.Error{Code: api.CodeInternal, Message: "internal error in " + h.Info.FullName() + "; the server log has the detail"}
}

// unavailable answers an IAM port's failure. Its text (a URL, a database's host) goes to the
// log only.
func (e *Envelope) unavailable(ctx context.Context, step string, err error) error {
	e.logger(ctx).WarnContext(ctx, "compute: IAM failed", "step", step, "error", err)
	return &api.Error{Code: api.CodeUnavailable, Message: "IAM could not " + step + "; try again shortly (the server log has the detail)",
		Details: map[string]any{"reason": "iam_unavailable"}}
}

func asAPIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &api.Error{Code: api.CodeInvalidArgument, Message: err.Error()}
}

// PruneIdempotencyKeys deletes keys older than ttl. The worker runs it periodically.
func PruneIdempotencyKeys(ctx context.Context, q postgres.Querier, ttl time.Duration) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM compute.idempotency_keys WHERE created_at < compute.compute_now() - make_interval(secs => $1)`, ttl.Seconds())
	return tag.RowsAffected(), err
}
