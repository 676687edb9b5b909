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
	"strconv"
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
			if err := decodeNone(body); err != nil {
				httpError(w, http.StatusBadRequest, HTTPInvalidRequest, route+": "+err.Error())
				return
			}
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
		v, err := l.serve(ctx, caller, route, body)
		if err != nil {
			status, code := http.StatusBadRequest, HTTPInvalidRequest
			switch {
			case unavailable(err):
				status, code = http.StatusInternalServerError, HTTPInternal // the client may retry
			case errors.Is(err, ErrUnauthenticated):
				status, code = http.StatusUnauthorized, HTTPUnauthenticated
			case errors.Is(err, ErrNotFound), errors.Is(err, errNoRoute):
				status, code = http.StatusNotFound, HTTPNotFound
			case errors.Is(err, errOutside):
				status, code = http.StatusForbidden, HTTPAccessDenied
			}
			httpError(w, status, code, route+": "+err.Error())
			return
		}
		writeData(w, v)
	})
}

var errNoRoute = errors.New("no such route")

// errOutside refuses what a caller may not do from its tenant (global state, another tenant's
// identity); a tenant outside the caller's is answered as not found instead, as one that does not
// exist is, so that no answer tells the two apart.
var errOutside = errors.New("outside the caller's tenant")

// within refuses, as not found, a tenant that is not the caller's or one of its descendants: every
// route acts only there.
func (l *Local) within(ctx context.Context, caller Principal, tenant string) error {
	if tenant == caller.TenantID && tenant != "" {
		return nil
	}
	ok, err := TenantWithin(ctx, l, tenant, caller.TenantID)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("tenant %q: %w", tenant, ErrNotFound)
	}
	return nil
}

// rootOnly refuses a change to what all tenants share (the catalog, the meters) to a caller
// outside the root tenant.
func (l *Local) rootOnly(caller Principal, what string) error {
	if caller.TenantID != l.opts.RootTenantID {
		return fmt.Errorf("%s is shared by every tenant; only a caller of the root tenant may change it: %w", what, errOutside)
	}
	return nil
}

// authenticateWithin authenticates the credential a service passes on, which must be of an
// identity of the caller's tenant or a descendant: a service decides only for its own.
func (l *Local) authenticateWithin(ctx context.Context, caller Principal, credential string) (Principal, error) {
	p, err := l.Authenticate(ctx, credential)
	if err != nil {
		return p, err
	}
	if err := l.within(ctx, caller, p.TenantID); err != nil {
		if errors.Is(err, ErrNotFound) {
			return Principal{}, fmt.Errorf("the credential's identity is not of the caller's tenant or a descendant: %w", errOutside)
		}
		return Principal{}, err
	}
	return p, nil
}

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
	if !atEnd(dec) {
		return v, errors.New("the request body: data after the JSON value")
	}
	return v, nil
}

// atEnd reports whether dec has nothing left but space. (dec.More is no test of that: it
// answers false for a stray '}' or ']' after the value.)
func atEnd(dec *json.Decoder) bool {
	_, err := dec.Token()
	return errors.Is(err, io.EOF)
}

// serve runs one route for caller, on the tenants the request names only where they are the
// caller's tenant or its descendants.
// decodeNone reads the body of a route without input: nothing, or an empty object.
func decodeNone(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	_, err := decode[struct{}](body)
	return err
}

func (l *Local) serve(ctx context.Context, caller Principal, route string, body []byte) (any, error) {
	switch route {
	case "authorize":
		in, err := decode[authorizeBody](body)
		if err != nil {
			return nil, err
		}
		p, err := l.authenticateWithin(ctx, caller, in.Credential)
		if err != nil {
			return nil, err
		}
		if in.Request != nil {
			ds, err := l.authorizeWithin(ctx, caller, p, []Request{*in.Request})
			if err != nil {
				return nil, err
			}
			return ds[0], nil
		}
		return l.authorizeWithin(ctx, caller, p, in.Requests)
	case "tenants/path":
		in, err := decode[struct {
			TenantID string `json:"tenantId"`
		}](body)
		if err != nil {
			return nil, err
		}
		path := []string{} // a tenant outside the caller's reads as one that does not exist
		if err := l.within(ctx, caller, in.TenantID); err != nil {
			if errors.Is(err, ErrNotFound) {
				return path, nil
			}
			return nil, err
		}
		if p, err := l.TenantPath(ctx, in.TenantID); err != nil || p != nil {
			return p, err
		}
		return path, nil
	case "catalog/register":
		in, err := decode[Catalog](body)
		if err != nil {
			return nil, err
		}
		if err := l.rootOnly(caller, "the catalog"); err != nil {
			return nil, err
		}
		return struct{}{}, l.RegisterCatalog(ctx, in)
	case "catalog/get":
		if err := decodeNone(body); err != nil {
			return nil, err
		}
		return l.Catalog(ctx)
	case "billing/ensureMeters":
		in, err := decode[struct {
			Meters []Meter `json:"meters"`
		}](body)
		if err != nil {
			return nil, err
		}
		if err := l.rootOnly(caller, "the set of meters"); err != nil {
			return nil, err
		}
		return struct{}{}, l.EnsureMeters(ctx, in.Meters)
	case "billing/record":
		in, err := decode[Usage](body)
		if err != nil {
			return nil, err
		}
		if err := l.within(ctx, caller, in.TenantID); err != nil {
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
		if err := l.within(ctx, caller, in.TenantID); err != nil {
			return nil, err
		}
		v, err := l.Flag(ctx, in.TenantID, in.Key)
		return map[string]bool{"value": v}, err
	case "delegations/requestConfirmation":
		in, err := decode[confirmationBody](body)
		if err != nil {
			return nil, err
		}
		p, err := l.authenticateWithin(ctx, caller, in.Credential)
		if err != nil {
			return nil, err
		}
		if err := l.within(ctx, caller, in.Request.TenantID); err != nil {
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
		c, err := l.Confirmation(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		if err := l.within(ctx, caller, c.Request.TenantID); err != nil {
			return nil, fmt.Errorf("iam: confirmation %q: %w", in.ID, ErrNotFound) // as if it did not exist
		}
		return c, nil
	case "events/list":
		in, err := decode[struct {
			After int64 `json:"after"`
			Limit int   `json:"limit"`
		}](body)
		if err != nil {
			return nil, err
		}
		evs, next, err := l.events(ctx, in.After, in.Limit, caller.TenantID)
		if evs == nil {
			evs = []Event{}
		}
		return map[string]any{"events": evs, "next": next}, err
	}
	return nil, errNoRoute
}

// authorizeWithin decides rs for p, each only in a tenant of the caller's: a request about
// another tenant is denied, in words that do not say whether it exists.
func (l *Local) authorizeWithin(ctx context.Context, caller, p Principal, rs []Request) ([]Decision, error) {
	out := make([]Decision, len(rs))
	var ask []Request
	var at []int
	for i, r := range rs {
		err := l.within(ctx, caller, r.TenantID)
		switch {
		case errors.Is(err, ErrNotFound):
			out[i] = Decision{Reason: "tenant " + strconv.Quote(r.TenantID) + " is not the caller's or one of its descendants"}
		case err != nil:
			return nil, err
		default:
			ask, at = append(ask, r), append(at, i)
		}
	}
	if len(ask) == 0 {
		return out, nil
	}
	ds, err := l.AuthorizeMany(ctx, p, ask)
	if err != nil {
		return nil, err
	}
	for j, d := range ds {
		out[at[j]] = d
	}
	return out, nil
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
