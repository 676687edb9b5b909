// Package stream serves the event log (internal/core/events) as Server-Sent Events: GET
// BasePath/events/stream, each read an events.list call with the request's own credential.
package stream

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/envelope"
)

// Handler is the event stream. Its zero value is not usable: List must be set.
type Handler struct {
	// List reads a page of events as events.list does, with cred as the credential.
	List func(ctx context.Context, cred string, in api.ListEvents) (api.Page[api.Event], error)
	// MaxPerKey is how many streams one credential may hold open in this process at once;
	// negative means no limit.
	MaxPerKey int

	slots slots
}

// Event stream timing: how often a stream with nothing new looks again, and how often it sends a
// comment so that proxies keep an idle stream open.
const (
	streamPoll      = 250 * time.Millisecond
	streamKeepalive = 15 * time.Second
)

// ServeHTTP serves GET BasePath/events/stream: the tenant's event log as Server-Sent
// Events, from after the Last-Event-ID header (or the after query parameter) on, filtered by
// the type and subject parameters. Each read is an events.list call with the request's
// credential, so the stream sees what that call may see, and ends (the client reconnects) when
// the credential no longer may. An event's SSE id is its log id: a client that reconnects with
// the last id it read misses nothing and receives nothing twice.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		envelope.WriteError(w, http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument, Message: r.Method + " is not allowed: the event stream is GET " + api.BasePath + api.EventStreamPath,
			Details: map[string]any{"reason": "method_not_allowed"}})
		return
	}
	q := r.URL.Query()
	in := api.ListEvents{TenantID: q.Get("tenantId"), Type: q.Get("type"), Subject: q.Get("subject"), PageRequest: api.PageRequest{Limit: api.MaxPageLimit}}
	from := r.Header.Get("Last-Event-ID")
	field := "Last-Event-ID"
	if from == "" {
		from, field = q.Get("after"), "after"
	}
	if from != "" {
		id, err := strconv.ParseInt(from, 10, 64)
		if err != nil || id < 0 {
			envelope.WriteError(w, 0, api.InvalidField(field, "%q is not an event id", from))
			return
		}
		in.After = id
	}
	// A server's WriteTimeout (the devserver's is 60 s) would cut a stream: each write gets a
	// deadline of its own instead.
	rc := http.NewResponseController(w)
	flush := func() error {
		if err := rc.Flush(); err != nil {
			return err
		}
		if err := rc.SetWriteDeadline(time.Now().Add(2 * streamKeepalive)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return err
		}
		return nil
	}
	ctx, cred := r.Context(), envelope.Bearer(r)
	// The first read answers errors (authentication, IAM, bad input) as the API does, before
	// the stream begins.
	page, err := h.List(ctx, cred, in)
	if err != nil {
		envelope.WriteError(w, 0, err)
		return
	}
	release, err := h.slots.take(cred, h.MaxPerKey)
	if err != nil {
		envelope.WriteError(w, 0, err)
		return
	}
	defer release()
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprintf(w, "retry: 1000\n\n")
	if flush() != nil {
		return
	}
	quiet := time.Now()
	for {
		for _, e := range page.Items {
			if err := writeEvent(w, e); err != nil {
				return
			}
			in.After = e.ID
		}
		if len(page.Items) > 0 {
			if flush() != nil {
				return
			}
			quiet = time.Now()
		}
		if len(page.Items) < in.PageLimit() {
			if time.Since(quiet) >= streamKeepalive {
				if _, err := fmt.Fprintf(w, ": keepalive\n\n"); err != nil || flush() != nil {
					return
				}
				quiet = time.Now()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(streamPoll):
			}
		}
		if page, err = h.List(ctx, cred, in); err != nil {
			if ctx.Err() == nil {
				// The credential was revoked, or the database is away: say so, and end; the
				// client reconnects from its last id.
				b, _ := json.Marshal(api.ErrorBody{Error: asError(err)})
				_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
				_ = flush()
			}
			return
		}
	}
}

// slots counts the event streams each credential holds open in this process, by the
// credential's hash (a stream outlives no process, so a count in memory is the truth).
type slots struct {
	mu   sync.Mutex
	open map[[sha256.Size]byte]int
}

// take holds one of the credential's max slots until release; negative max is no limit.
func (s *slots) take(cred string, max int) (release func(), err error) {
	if max < 0 {
		return func() {}, nil
	}
	k := sha256.Sum256([]byte(cred))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[k] >= max {
		return nil, &api.Error{Code: api.CodeQuotaExceeded,
			Message: fmt.Sprintf("this credential holds %d event streams already, the most it may hold at once: end one, or read events.list", max),
			Details: map[string]any{"reason": "event_streams", "limit": max}}
	}
	if s.open == nil {
		s.open = make(map[[sha256.Size]byte]int)
	}
	s.open[k]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.open[k]--; s.open[k] == 0 {
			delete(s.open, k)
		}
	}, nil
}

// writeEvent writes one event in the SSE framing: its log id, its type as the event name, and
// its JSON (one line) as the data.
func writeEvent(w http.ResponseWriter, e api.Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", e.ID, e.Type, b)
	return err
}

// asError is err as the API's error, an internal one if it is none.
func asError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &api.Error{Code: api.CodeInternal, Message: "internal error"}
}

// Is reports whether r is for the event stream, however the API's handler is mounted.
func Is(r *http.Request) bool {
	return strings.TrimPrefix(r.URL.Path, api.BasePath) == api.EventStreamPath
}
