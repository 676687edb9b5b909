package compute_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

type logIn struct{}

func (logIn) Validate() error { return nil }

type logOut struct {
	OK bool `json:"ok"`
}

var logHello = api.NewMethod[logIn, logOut]("logtest", "hello", false, "logtest-thing", "v0.1", "Log a line from a module.")

// logModule logs one line per call, as a module does, with the call's context.
type logModule struct{}

func (logModule) Name() string { return "logtest" }

func (logModule) Register(r *modules.Registry) error {
	r.ResourceTypes(iam.ResourceType{Name: "logtest-thing", Description: "nothing"})
	r.Actions(modules.ActionsFor(logHello.Info())...)
	modules.Handle(r, logHello, nil, func(ctx context.Context, c *modules.Call, _ logIn) (logOut, error) {
		c.Runtime.Logger.InfoContext(ctx, "a module's line")
		c.Runtime.Logger.With("request_id", "mine").InfoContext(ctx, "a line that names its own")
		return logOut{OK: true}, nil
	})
	return nil
}

// TestModuleLogLinesNameTheCallsRequestID calls a module's method over HTTP with a request id and
// finds that id on the line the module logged, once.
func TestModuleLogLinesNameTheCallsRequestID(t *testing.T) {
	t.Parallel()
	var logs computetest.Buffer
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{logModule{}}, Configure: func(o *compute.Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	}})
	url := env.Server(t)
	req, _ := http.NewRequest(http.MethodPost, url+"/api/compute/logtest/hello", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+env.RootKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "req-logtest-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("logtest.hello: %s", resp.Status)
	}
	found := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a log line is not JSON: %q", line)
		}
		if msg, _ := rec["msg"].(string); strings.Contains(msg, "line") {
			if strings.Count(line, `"request_id"`) != 1 {
				t.Errorf("%q names request_id %d times, want once", line, strings.Count(line, `"request_id"`))
			}
			found[msg], _ = rec["request_id"].(string)
		}
	}
	if found["a module's line"] != "req-logtest-1" || found["a line that names its own"] != "mine" {
		t.Errorf("the module's lines name request ids %v, want req-logtest-1 and mine", found)
	}
}
