package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
)

// TestEventsWatchFromNow: events watch --from-now prints only what is written after it starts
// (there was no way but --after with an id found by hand), and lastEventID finds the newest
// event a key may see with a few reads.
func TestEventsWatchFromNow(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	ctx := context.Background()
	a := env.Compute.API
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	var max int64
	for i := range 37 {
		if got, err := lastEventID(ctx, cl, ""); err != nil || got != max {
			t.Fatalf("lastEventID with %d events = %d, %v; want %d", i, got, err, max)
		}
		w, err := a.Webhooks.Create(ctx, env.RootKey, api.CreateWebhook{URL: "https://hooks.example.com/x"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Webhooks.Test(ctx, env.RootKey, api.WebhookRef{Webhook: w.ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Webhooks.Delete(ctx, env.RootKey, api.WebhookRef{Webhook: w.ID}); err != nil {
			t.Fatal(err)
		}
		// The API's ids are the log's places, which its sequencer gives (a worker this test
		// does not start).
		if _, err := events.Sequence(ctx, env.DB); err != nil {
			t.Fatal(err)
		}
		env.DB.Pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM compute.events`).Scan(&max)
	}

	conn := connection(t, url, env.RootKey)
	done := make(chan struct{})
	var stdout, stderr bytes.Buffer
	var code int
	go func() {
		defer close(done)
		code = run(append(conn, "events", "watch", "--from-now", "--count", "1", "-o", "json"), &stdout, &stderr)
	}()
	// Events are written until the watch has one: whichever it printed came after its start.
	w, err := a.Webhooks.Create(ctx, env.RootKey, api.CreateWebhook{URL: "https://hooks.example.com/late"})
	if err != nil {
		t.Fatal(err)
	}
	for waiting := true; waiting; {
		if _, err := a.Webhooks.Test(ctx, env.RootKey, api.WebhookRef{Webhook: w.ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := events.Sequence(ctx, env.DB); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
			waiting = false
		case <-time.After(100 * time.Millisecond):
		}
	}
	var e api.Event
	if code != 0 || json.Unmarshal(stdout.Bytes(), &e) != nil || e.ID <= max || !strings.HasPrefix(e.Type, "webhook.") {
		t.Fatalf("events watch --from-now = %d, %+v (the log held %d before)\n%s%s", code, e, max, &stdout, &stderr)
	}
	if code := run(append(conn, "events", "watch", "--from-now", "--after", "3"), &stdout, &stderr); code != exitUsage {
		t.Fatalf("--from-now with --after = %d", code)
	}
}

// TestLastID: the search finds the largest of any set of ids, however large, in few reads.
func TestLastID(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfDistinct(rapid.OneOf(rapid.Int64Range(1, 1000), rapid.Int64Range(1, math.MaxInt64)), rapid.ID[int64]).Draw(t, "ids")
		slices.Sort(ids)
		reads := 0
		got, err := lastID(func(after int64) (int64, error) {
			reads++
			if i, _ := slices.BinarySearch(ids, after+1); i < len(ids) && after < math.MaxInt64 {
				return ids[i], nil
			}
			return 0, nil
		})
		want := int64(0)
		if len(ids) > 0 {
			want = ids[len(ids)-1]
		}
		if err != nil || got != want || reads > 2*64+2 {
			t.Fatalf("lastID of %v = %d, %v in %d reads; want %d", ids, got, err, reads, want)
		}
	})
}
