package api

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"
)

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

// ValidateIdempotencyKey checks an idempotency key: at most MaxIdempotencyKey bytes of printable
// UTF-8 text (no control characters). The error names the header.
func ValidateIdempotencyKey(key string) error {
	if len(key) > MaxIdempotencyKey {
		return InvalidField(IdempotencyKeyHeader, "is %d bytes long; the limit is %d", len(key), MaxIdempotencyKey)
	}
	if !utf8.ValidString(key) {
		return InvalidField(IdempotencyKeyHeader, "is not valid UTF-8")
	}
	if strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return InvalidField(IdempotencyKeyHeader, "contains a control character")
	}
	return nil
}
