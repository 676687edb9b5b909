package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/compute/api"
)

// WatchOptions filter and start an event watch.
type WatchOptions struct {
	After    int64  // the id of the last event already seen; 0: from the log's beginning
	TenantID string // default: the key's tenant
	Type     string // an event type, or a prefix ending in "."
	Subject  string
}

// WatchEvents follows the event stream (GET /api/compute/events/stream) and calls fn for each
// event, in log order, until ctx ends or fn returns an error (which it returns). A dropped
// connection is resumed after the last event handed to fn, with jittered backoff: fn sees every
// event once, with no gap. An answer of the API that will not change by retrying (bad input,
// authentication, permission) is returned.
func (c *Client) WatchEvents(ctx context.Context, o WatchOptions, fn func(api.Event) error) error {
	backoff := 200 * time.Millisecond
	for {
		got, err := c.watchOnce(ctx, &o, fn)
		var fnErr callbackError
		switch {
		case errors.As(err, &fnErr):
			return fnErr.err
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && !retryable(err) && !errors.Is(err, errStreamEnded):
			return err
		}
		if got {
			backoff = 200 * time.Millisecond
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// errStreamEnded: the server ended the stream (it said why in an error event, or closed it).
var errStreamEnded = errors.New("client: the event stream ended")

// watchOnce reads one connection of the stream, advancing o.After; got says whether any event
// arrived.
func (c *Client) watchOnce(ctx context.Context, o *WatchOptions, fn func(api.Event) error) (got bool, err error) {
	q := url.Values{}
	for k, v := range map[string]string{"tenantId": o.TenantID, "type": o.Type, "subject": o.Subject} {
		if v != "" {
			q.Set(k, v)
		}
	}
	u := c.base + api.BasePath + api.EventStreamPath
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", c.agent)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if o.After > 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(o.After, 10))
	}
	// The stream outlives any request timeout of c.http: the same transport, no timeout.
	h := *c.http
	h.Timeout = 0
	resp, err := h.Do(req)
	if err != nil {
		return false, &netError{err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return false, answerError("the event stream", resp, raw)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var name, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != "" {
				if name == "error" {
					var body api.ErrorBody
					if json.Unmarshal([]byte(data), &body) == nil && body.Error != nil {
						return got, fmt.Errorf("%w: %w", errStreamEnded, body.Error)
					}
					return got, errStreamEnded
				}
				var e api.Event
				if err := json.Unmarshal([]byte(data), &e); err != nil {
					return got, fmt.Errorf("client: decode an event: %w", err)
				}
				if err := fn(e); err != nil {
					return got, callbackError{err}
				}
				got, o.After = true, e.ID
			}
			name, data = "", ""
		case strings.HasPrefix(line, "event:"):
			name = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(line[len("data:"):], " ")
		}
	}
	if err := sc.Err(); err != nil {
		return got, &netError{fmt.Errorf("the event stream: %w", err)}
	}
	return got, errStreamEnded
}
