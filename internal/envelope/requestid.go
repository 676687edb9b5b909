package envelope

import (
	"context"
	"log/slog"
)

type requestIDKey struct{}

// MaxRequestIDLength bounds a caller's request id.
const MaxRequestIDLength = 128

// ValidRequestID reports whether id may be used as a request id: 1 to MaxRequestIDLength
// letters, digits and "-_.:", so that it is safe in a header and a log line as it is.
func ValidRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLength {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// WithRequestID returns ctx carrying the request id id, which the envelope's logs of the call
// name as request_id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID returns the request id ctx carries, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// logger is the envelope's logger for a call, naming its request id when it has one.
func (e *Envelope) logger(ctx context.Context) *slog.Logger {
	if id := RequestID(ctx); id != "" {
		return e.log.With("request_id", id)
	}
	return e.log
}
