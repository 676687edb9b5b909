// Package client is the typed Go client of the Better Compute API: one call per method of the
// method table (package api), the same input and output types as the server, typed errors
// (errors.As gives an *api.Error with its code and details), retries only where they are safe,
// and context deadlines. It imports neither pgx nor grpc.
//
//	cl, err := client.New("https://compute.example.com", client.WithAPIKey(key))
//	r, err := cl.Reservations.Create(ctx, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 8}})
package client

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
	"strings"
	"time"

	"github.com/better-compute/compute/api"
)

// Client calls one control plane.
type Client struct {
	groups

	base    string
	key     string
	http    *http.Client
	retries int
	agent   string
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey authenticates every call with key.
func WithAPIKey(key string) Option { return func(c *Client) { c.key = key } }

// WithHTTPClient sends calls through h (for TLS settings, proxies, transports).
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithRetries sets how many times a call that is safe to repeat is retried after a network error
// or an unavailable answer; default 2. Reads are safe; a mutation is safe only with an
// idempotency key (api.WithIdempotencyKey).
func WithRetries(n int) Option { return func(c *Client) { c.retries = n } }

// WithUserAgent names the caller in the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.agent = ua } }

// New returns a client of the control plane at baseURL (its scheme, host and any path prefix
// before /api/compute).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: %q is not an http or https URL", baseURL)
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{Timeout: 60 * time.Second}, retries: 2, agent: "better-compute-go"}
	for _, o := range opts {
		o(c)
	}
	if c.retries < 0 {
		return nil, errors.New("client: retries must not be negative")
	}
	c.groups = newGroups(c)
	return c, nil
}

// Methods returns the method table the server serves (GET /api/compute/methods): every method of
// its core and its modules, with its input's JSON schema.
func (c *Client) Methods(ctx context.Context) ([]api.MethodDescription, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+api.BasePath+"/methods", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, answerError("the method table", resp, raw)
	}
	var t struct {
		Methods []api.MethodDescription `json:"methods"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		return nil, fmt.Errorf("client: decode the method table: %w", err)
	}
	return t.Methods, nil
}

// Call invokes any method, a module's included, with its typed description.
func Call[In, Out any](ctx context.Context, c *Client, m api.Method[In, Out], in In) (Out, error) {
	return call(ctx, c, m, in)
}

func call[In, Out any](ctx context.Context, c *Client, m api.Method[In, Out], in In) (Out, error) {
	var out Out
	raw, err := c.Do(ctx, m.Info(), in)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("client: decode the answer of %s: %w", m.FullName(), err)
	}
	return out, nil
}

// Do sends one call with an untyped input and returns the answer's JSON: the CLI and the MCP
// tools use it, typed callers the generated methods.
func (c *Client) Do(ctx context.Context, m api.MethodInfo, in any) (json.RawMessage, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("client: encode the input of %s: %w", m.FullName(), err)
	}
	key := api.IdempotencyKey(ctx)
	safe := !m.Mutating || key != ""
	backoff := 200 * time.Millisecond
	for attempt := 0; ; attempt++ {
		raw, err := c.once(ctx, m, body, key)
		if err == nil || !safe || attempt >= c.retries || !retryable(err) || ctx.Err() != nil {
			return raw, err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		backoff *= 2
	}
}

// retryable: the network failed, or the server said it is unavailable for now.
func retryable(err error) bool {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Code == api.CodeUnavailable
	}
	var ne *netError
	return errors.As(err, &ne)
}

// netError is a call that did not get an answer.
type netError struct{ err error }

func (e *netError) Error() string { return "client: " + e.err.Error() }
func (e *netError) Unwrap() error { return e.err }

func (c *Client) once(ctx context.Context, m api.MethodInfo, body []byte, key string) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+m.Path(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", c.agent)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if key != "" {
		req.Header.Set(api.IdempotencyKeyHeader, key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &netError{err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, &netError{err}
	}
	if resp.StatusCode == http.StatusOK {
		return raw, nil
	}
	return nil, answerError(m.FullName(), resp, raw)
}

// answerError is the error of an answer other than 200: the API's typed error, or one made from
// the status when something else (a proxy) answered.
func answerError(what string, resp *http.Response, raw []byte) error {
	var eb api.ErrorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		return eb.Error
	}
	code := api.CodeInternal
	if resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout {
		code = api.CodeUnavailable
	}
	return &api.Error{Code: code, Message: fmt.Sprintf("%s answered %s: %s", what, resp.Status, strings.TrimSpace(string(raw)))}
}
