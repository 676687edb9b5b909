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

// LogHandler wraps h so that every record logged with a context carrying a request id (the
// …Context methods of slog) names it as request_id: a module's lines of a call are found by the
// call's id, as the envelope's are. A logger that already names request_id (With) is left so.
func LogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(requestIDHandler); ok {
		return h
	}
	return requestIDHandler{Handler: h}
}

type requestIDHandler struct {
	slog.Handler
	named bool // a request_id attribute is already attached
}

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := RequestID(ctx); id != "" && !h.named {
		r = r.Clone()
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(as []slog.Attr) slog.Handler {
	named := h.named
	for _, a := range as {
		named = named || a.Key == "request_id"
	}
	return requestIDHandler{Handler: h.Handler.WithAttrs(as), named: named}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{Handler: h.Handler.WithGroup(name), named: h.named}
}
