package envelope

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
)

// RequestIDHeader carries a request's id: the caller's when it sent a well-formed one (see
// ValidRequestID), else a new one; it is answered in the same header and attached to what the
// envelope logs of the call.
const RequestIDHeader = "X-Request-Id"

// MethodsPath lists the method table: GET BasePath/methods.
const MethodsPath = api.BasePath + "/methods"

// ServeHTTP serves POST /api/compute/{group}/{method} (and the method table at GET
// /api/compute/methods). It also works mounted under http.StripPrefix.
func (e *Envelope) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rid := r.Header.Get(RequestIDHeader)
	if !ValidRequestID(rid) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		rid = hex.EncodeToString(b[:])
	}
	w.Header().Set(RequestIDHeader, rid)
	r = r.WithContext(WithRequestID(r.Context(), rid))

	path := strings.TrimPrefix(r.URL.Path, api.BasePath)
	group, method, ok := strings.Cut(strings.Trim(path, "/"), "/")
	if path == "/methods" || !ok && group == "methods" {
		e.serveTable(w, r)
		return
	}
	if !ok || group == "" || method == "" || strings.Contains(method, "/") {
		writeError(w, 0, &api.Error{Code: api.CodeNotFound, Message: "no such route: API methods are POST " + api.BasePath + "/{group}/{method}",
			Details: map[string]any{"reason": "unknown_method", "path": r.URL.Path}})
		return
	}
	h, found := e.reg.Lookup(group, method)
	if !found {
		writeError(w, 0, &api.Error{Code: api.CodeNotFound, Message: "unknown method " + group + "." + method + "; GET " + MethodsPath + " lists them",
			Details: map[string]any{"reason": "unknown_method", "group": group, "method": method}})
		return
	}
	start := time.Now()
	err := e.serveCall(w, r, h)
	e.observe(h, start, &err)
}

// serveCall runs one call of h over HTTP and writes its answer; it returns the error it answered.
func (e *Envelope) serveCall(w http.ResponseWriter, r *http.Request, h *modules.Handler) error {
	fail := func(status int, err error) error {
		writeError(w, status, err)
		return err
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument,
			Message: r.Method + " is not allowed: call " + h.Info.FullName() + " with POST",
			Details: map[string]any{"reason": "method_not_allowed"}})
	}
	ctx := r.Context()
	p, err := e.authenticate(ctx, bearer(r))
	if err != nil {
		return fail(0, err)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, e.maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fail(http.StatusRequestEntityTooLarge, &api.Error{Code: api.CodeInvalidArgument,
				Message: "body is larger than the limit of " + itoa(e.maxBody) + " bytes",
				Details: map[string]any{"reason": "body_too_large", "limit": e.maxBody}})
		}
		return fail(0, &api.Error{Code: api.CodeInvalidArgument, Message: "read body: " + err.Error(),
			Details: map[string]any{"reason": "invalid_json"}})
	}
	in, err := h.Decode(body)
	if err != nil {
		return fail(0, err)
	}
	if k := r.Header.Get(api.IdempotencyKeyHeader); k != "" {
		ctx = api.WithIdempotencyKey(ctx, k)
	}
	res, err := e.invoke(ctx, p, h, in)
	if err != nil {
		return fail(0, err)
	}
	if res.Replay != nil {
		w.Header().Set("Idempotent-Replayed", "true")
		e.writeAnswer(w, r, h, json.RawMessage(res.Replay))
		return nil
	}
	e.writeAnswer(w, r, h, res.Value)
	return nil
}

// writeAnswer writes a call's answer, and logs an answer that could not be encoded: the call
// itself has already committed.
func (e *Envelope) writeAnswer(w http.ResponseWriter, r *http.Request, h *modules.Handler, v any) {
	if err := writeJSON(w, http.StatusOK, v); err != nil {
		e.logger(r.Context()).ErrorContext(r.Context(), "compute: answer could not be encoded", "method", h.Info.FullName(), "error", err)
	}
}

func (e *Envelope) serveTable(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST")
		writeError(w, http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument, Message: r.Method + " is not allowed on " + MethodsPath,
			Details: map[string]any{"reason": "method_not_allowed"}})
		return
	}
	_ = writeJSON(w, http.StatusOK, MethodTable{Methods: e.table})
}

// MethodTable is the answer of GET /api/compute/methods.
type MethodTable struct {
	Methods []api.MethodDescription `json:"methods"`
}

// Methods returns every method served, core and modules', in registration order.
func (e *Envelope) Methods() []api.MethodInfo {
	out := make([]api.MethodInfo, len(e.table))
	for i, m := range e.table {
		out[i] = m.MethodInfo
	}
	return out
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// writeJSON encodes v before anything is sent, so that a value that cannot be encoded (a time
// past year 9999, a NaN) never becomes a 2xx with an empty body: it answers 500 internal
// instead, and returns the error for the caller to log.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(v)
	if err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		_ = json.NewEncoder(&buf).Encode(api.ErrorBody{Error: &api.Error{Code: api.CodeInternal,
			Message: "the answer could not be encoded as JSON; the server log has the detail"}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	return err
}

// writeError writes err as the error envelope; status 0 means the code's status.
func writeError(w http.ResponseWriter, status int, err error) {
	ae := asAPIError(err)
	if status == 0 {
		status = ae.Code.HTTPStatus()
	}
	_ = writeJSON(w, status, api.ErrorBody{Error: ae})
}

// Unavailable is an http.Handler that answers every request with an unavailable error, for
// surfaces that are not served by this process.
func Unavailable(what string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, 0, &api.Error{Code: api.CodeUnavailable, Message: what + " is not served here"})
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// WriteError writes err as the error envelope, for the API's routes outside the method calls
// (the event stream); status 0 means the code's status.
func WriteError(w http.ResponseWriter, status int, err error) { writeError(w, status, err) }

// Bearer is the credential of a request: its Authorization header's bearer token.
func Bearer(r *http.Request) string { return bearer(r) }
