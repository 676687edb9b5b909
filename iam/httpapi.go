package iam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The part of Better IAM's HTTP contract Better Compute uses: POST {base}/api/iam/{group}/{method}
// (and /api/iam/authorize), JSON in, {"data": …} or {"error": {"code", "message"}} out, with
// X-Better-IAM: 1 (a header a browser form cannot send) and Authorization: Bearer. A denial is 200
// with allowed false.

// HTTP error codes of the contract.
const (
	HTTPUnauthenticated = "UNAUTHENTICATED"
	HTTPAccessDenied    = "ACCESS_DENIED"
	HTTPInvalidRequest  = "INVALID_REQUEST"
	HTTPNotFound        = "NOT_FOUND"
	HTTPInternal        = "INTERNAL"
)

// BasePath is where the contract is served.
const BasePath = "/api/iam/"

// authorizeBody is the input of /authorize: the caller's credential and the request(s).
type authorizeBody struct {
	Credential string    `json:"credential"`
	Request    *Request  `json:"request,omitempty"`
	Requests   []Request `json:"requests,omitempty"`
}

type confirmationBody struct {
	Credential string  `json:"credential"`
	Request    Request `json:"request"`
}

// Handler serves the contract. Authenticating a token (sts/getCallerIdentity) takes that token as
// the bearer; every other call takes a service's key, whose identity must be allowed
// iam:{group}:{method} on iam/* in its tenant.
func (l *Local) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		route, ok := strings.CutPrefix(r.URL.Path, BasePath)
		if !ok || r.Method != http.MethodPost {
			httpError(w, http.StatusNotFound, HTTPNotFound, "not a route of this IAM: POST "+BasePath+"{group}/{method}")
			return
		}
		if r.Header.Get("X-Better-IAM") != "1" {
			httpError(w, http.StatusForbidden, HTTPInvalidRequest, "missing header X-Better-IAM: 1")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			httpError(w, http.StatusBadRequest, HTTPInvalidRequest, "read body: "+err.Error())
			return
		}
		bearer := ""
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			bearer = strings.TrimSpace(a[7:])
		}
		caller, err := l.Authenticate(ctx, bearer)
		if err != nil {
			httpError(w, http.StatusUnauthorized, HTTPUnauthenticated, err.Error())
			return
		}
		if route == "sts/getCallerIdentity" {
			writeData(w, caller)
			return
		}
		action := "iam:" + strings.ReplaceAll(route, "/", ":")
		if route == "authorize" {
			action = "iam:decisions:authorize"
		}
		d, err := l.Authorize(ctx, caller, Request{TenantID: caller.TenantID, Action: action, Resource: Resource{Type: "iam", ID: "*"}})
		if err != nil {
			httpError(w, http.StatusInternalServerError, HTTPInternal, err.Error())
			return
		}
		if !d.Allowed {
			httpError(w, http.StatusForbidden, HTTPAccessDenied, "the caller may not "+action+": "+d.Reason)
			return
		}
		v, err := l.serve(ctx, route, body)
		if err != nil {
			status, code := http.StatusBadRequest, HTTPInvalidRequest
			switch {
			case unavailable(err):
				status, code = http.StatusInternalServerError, HTTPInternal // the client may retry
			case errors.Is(err, ErrUnauthenticated):
				status, code = http.StatusUnauthorized, HTTPUnauthenticated
			case errors.Is(err, ErrNotFound), errors.Is(err, errNoRoute):
				status, code = http.StatusNotFound, HTTPNotFound
			}
			httpError(w, status, code, route+": "+err.Error())
			return
		}
		writeData(w, v)
	})
}

var errNoRoute = errors.New("no such route")

// unavailable reports whether err is the database failing rather than the request being wrong:
// a lost connection, a timeout, or an error of a class other than bad data (22) and constraint
// violations (23).
func unavailable(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return !strings.HasPrefix(pg.Code, "22") && !strings.HasPrefix(pg.Code, "23")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err)
}

// decode reads a request body, refusing unknown fields and anything after the one value.
func decode[T any](body []byte) (T, error) {
	var v T
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, fmt.Errorf("the request body: %w", err)
	}
	if dec.More() {
		return v, errors.New("the request body: data after the JSON value")
	}
	return v, nil
}

func (l *Local) serve(ctx context.Context, route string, body []byte) (any, error) {
	switch route {
	case "authorize":
		in, err := decode[authorizeBody](body)
		if err != nil {
			return nil, err
		}
		p, err := l.Authenticate(ctx, in.Credential)
		if err != nil {
			return nil, err
		}
		if in.Request != nil {
			return l.Authorize(ctx, p, *in.Request)
		}
		return l.AuthorizeMany(ctx, p, in.Requests)
	case "tenants/path":
		in, err := decode[struct {
			TenantID string `json:"tenantId"`
		}](body)
		if err != nil {
			return nil, err
		}
		path, err := l.TenantPath(ctx, in.TenantID)
		if path == nil {
			path = []string{}
		}
		return path, err
	case "catalog/register":
		in, err := decode[Catalog](body)
		if err != nil {
			return nil, err
		}
		return struct{}{}, l.RegisterCatalog(ctx, in)
	case "catalog/get":
		return l.Catalog(ctx)
	case "billing/ensureMeters":
		in, err := decode[struct {
			Meters []Meter `json:"meters"`
		}](body)
		if err != nil {
			return nil, err
		}
		return struct{}{}, l.EnsureMeters(ctx, in.Meters)
	case "billing/record":
		in, err := decode[Usage](body)
		if err != nil {
			return nil, err
		}
		return l.RecordUsage(ctx, in)
	case "flags/evaluate":
		in, err := decode[struct {
			TenantID string `json:"tenantId"`
			Key      string `json:"key"`
		}](body)
		if err != nil {
			return nil, err
		}
		v, err := l.Flag(ctx, in.TenantID, in.Key)
		return map[string]bool{"value": v}, err
	case "delegations/requestConfirmation":
		in, err := decode[confirmationBody](body)
		if err != nil {
			return nil, err
		}
		p, err := l.Authenticate(ctx, in.Credential)
		if err != nil {
			return nil, err
		}
		return l.RequestConfirmation(ctx, p, in.Request)
	case "delegations/getConfirmation":
		in, err := decode[struct {
			ID string `json:"id"`
		}](body)
		if err != nil {
			return nil, err
		}
		return l.Confirmation(ctx, in.ID)
	case "events/list":
		in, err := decode[struct {
			After int64 `json:"after"`
			Limit int   `json:"limit"`
		}](body)
		if err != nil {
			return nil, err
		}
		evs, next, err := l.Events(ctx, in.After, in.Limit)
		if evs == nil {
			evs = []Event{}
		}
		return map[string]any{"events": evs, "next": next}, err
	}
	return nil, errNoRoute
}

func writeData(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"data": v})
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
