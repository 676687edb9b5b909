package iam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// RemoteOptions configure a client of a Better IAM server.
type RemoteOptions struct {
	// Timeout bounds one call; default 5s.
	Timeout time.Duration
	// Retries is how many times a call is repeated after a network error or a 5xx; default 2.
	// Every call of the contract Better Compute makes is safe to repeat (decisions and reads;
	// billing is idempotent by its key; a confirmation request returns the open one).
	Retries int
	// RegisterCatalog makes RegisterCatalog register Better Compute's resource types and actions
	// as managed resources. Without it, the deployment must have them already, and
	// RegisterCatalog says which are missing.
	RegisterCatalog bool
	HTTPClient      *http.Client
}

// RemoteIAM is an iam.Port that talks to a Better IAM server over its HTTP contract.
type RemoteIAM struct {
	base string
	key  string
	opts RemoteOptions
}

var _ Port = (*RemoteIAM)(nil)

// Remote returns a port of the Better IAM at baseURL, calling as the service whose key is
// serviceKey.
func Remote(baseURL, serviceKey string, opts RemoteOptions) (*RemoteIAM, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("iam.Remote: %q is not an http or https URL", baseURL)
	}
	if _, err := ParseToken(serviceKey); err != nil {
		return nil, fmt.Errorf("iam.Remote: the service key: %w", err)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Retries == 0 {
		opts.Retries = 2
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	return &RemoteIAM{base: strings.TrimRight(baseURL, "/"), key: serviceKey, opts: opts}, nil
}

// remoteError is an error answer of the server.
type remoteError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *remoteError) Error() string { return "iam: " + e.Code + ": " + e.Message }

func (e *remoteError) Unwrap() error {
	switch e.Code {
	case HTTPUnauthenticated:
		return ErrUnauthenticated
	case HTTPNotFound:
		return ErrNotFound
	}
	return nil
}

// call POSTs in to route with bearer and decodes the data of the answer into out.
func (r *RemoteIAM) call(ctx context.Context, route, bearer string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err = r.once(ctx, route, bearer, body, out)
		var re *remoteError
		retry := err != nil && (!errors.As(err, &re) || re.Status >= 500)
		if !retry || attempt >= r.opts.Retries || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff *= 2
	}
}

func (r *RemoteIAM) once(ctx context.Context, route, bearer string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+BasePath+route, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-IAM", "1")
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := r.opts.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("iam: %s: %w", route, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("iam: %s: %w", route, err)
	}
	var env struct {
		Data  json.RawMessage `json:"data"`
		Error *remoteError    `json:"error"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return &remoteError{Status: resp.StatusCode, Code: HTTPInternal, Message: fmt.Sprintf("%s answered %s, not the contract's JSON", route, resp.Status)}
	}
	if env.Error != nil {
		env.Error.Status = resp.StatusCode
		return env.Error
	}
	if resp.StatusCode != http.StatusOK {
		return &remoteError{Status: resp.StatusCode, Code: HTTPInternal, Message: route + " answered " + resp.Status}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(env.Data, out)
}

// Authenticate implements Port: sts/getCallerIdentity with the credential as the bearer.
func (r *RemoteIAM) Authenticate(ctx context.Context, credential string) (Principal, error) {
	if credential == "" {
		return Principal{}, fmt.Errorf("%w: no credential", ErrUnauthenticated)
	}
	if _, err := ParseToken(credential); err != nil {
		return Principal{}, err // refused here, without a round trip
	}
	var p Principal
	if err := r.call(ctx, "sts/getCallerIdentity", credential, struct{}{}, &p); err != nil {
		return Principal{}, err
	}
	p.Credential = credential
	return p, nil
}

// Authorize implements Port.
func (r *RemoteIAM) Authorize(ctx context.Context, p Principal, req Request) (Decision, error) {
	var d Decision
	err := r.call(ctx, "authorize", r.key, authorizeBody{Credential: p.Credential, Request: &req}, &d)
	return d, err
}

// AuthorizeMany implements Port.
func (r *RemoteIAM) AuthorizeMany(ctx context.Context, p Principal, reqs []Request) ([]Decision, error) {
	var ds []Decision
	err := r.call(ctx, "authorize", r.key, authorizeBody{Credential: p.Credential, Requests: reqs}, &ds)
	if err == nil && len(ds) != len(reqs) {
		err = fmt.Errorf("iam: authorize answered %d decisions for %d requests", len(ds), len(reqs))
	}
	return ds, err
}

// TenantPath implements Port.
func (r *RemoteIAM) TenantPath(ctx context.Context, tenant string) ([]string, error) {
	var path []string
	err := r.call(ctx, "tenants/path", r.key, map[string]string{"tenantId": tenant}, &path)
	return path, err
}

// RegisterCatalog implements Port: it registers the catalog (RemoteOptions.RegisterCatalog), or
// checks that the deployment has it and says what is missing.
func (r *RemoteIAM) RegisterCatalog(ctx context.Context, c Catalog) error {
	if r.opts.RegisterCatalog {
		return r.call(ctx, "catalog/register", r.key, c, nil)
	}
	var have Catalog
	if err := r.call(ctx, "catalog/get", r.key, struct{}{}, &have); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, a := range have.Actions {
		known[a.Name] = true
	}
	var missing []string
	for _, a := range c.Actions {
		if !known[a.Name] {
			missing = append(missing, a.Name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("iam: the Better IAM at %s lacks %d of Better Compute's %d actions (e.g. %s): register the compute-* catalog there, or set RemoteOptions.RegisterCatalog to register it as managed resources",
			r.base, len(missing), len(c.Actions), strings.Join(missing[:min(3, len(missing))], ", "))
	}
	return nil
}

// EnsureMeters implements Port.
func (r *RemoteIAM) EnsureMeters(ctx context.Context, meters []Meter) error {
	return r.call(ctx, "billing/ensureMeters", r.key, map[string]any{"meters": meters}, nil)
}

// RecordUsage implements Port.
func (r *RemoteIAM) RecordUsage(ctx context.Context, u Usage) (Receipt, error) {
	var rc Receipt
	err := r.call(ctx, "billing/record", r.key, u, &rc)
	return rc, err
}

// Flag implements Port.
func (r *RemoteIAM) Flag(ctx context.Context, tenantID, key string) (bool, error) {
	var out struct {
		Value bool `json:"value"`
	}
	err := r.call(ctx, "flags/evaluate", r.key, map[string]string{"tenantId": tenantID, "key": key}, &out)
	return out.Value, err
}

// RequestConfirmation implements Port.
func (r *RemoteIAM) RequestConfirmation(ctx context.Context, p Principal, req Request) (Confirmation, error) {
	var c Confirmation
	err := r.call(ctx, "delegations/requestConfirmation", r.key, confirmationBody{Credential: p.Credential, Request: req}, &c)
	return c, err
}

// Confirmation implements Port.
func (r *RemoteIAM) Confirmation(ctx context.Context, id string) (Confirmation, error) {
	var c Confirmation
	err := r.call(ctx, "delegations/getConfirmation", r.key, map[string]string{"id": id}, &c)
	return c, err
}

// Events implements Port.
func (r *RemoteIAM) Events(ctx context.Context, after int64, limit int) ([]Event, int64, error) {
	var out struct {
		Events []Event `json:"events"`
		Next   int64   `json:"next"`
	}
	err := r.call(ctx, "events/list", r.key, map[string]any{"after": after, "limit": limit}, &out)
	return out.Events, out.Next, err
}
