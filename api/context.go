package api

import "context"

// IdempotencyKeyHeader is the HTTP header that carries a mutation's idempotency key.
const IdempotencyKeyHeader = "Idempotency-Key"

// MaxIdempotencyKey is the longest idempotency key accepted.
const MaxIdempotencyKey = 200

type idempotencyKey struct{}

// WithIdempotencyKey returns a context that makes the next mutation called with it idempotent
// under key: a repeat with the same key and input returns the first answer without acting again.
// Both the in-process API and the typed client read it.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// IdempotencyKey returns the key set by WithIdempotencyKey, or "".
func IdempotencyKey(ctx context.Context) string {
	k, _ := ctx.Value(idempotencyKey{}).(string)
	return k
}
