package mcptools_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/tools/mcptools"
)

// withKey sends every request of an MCP client with a bearer key.
type withKey struct{ key string }

func (k withKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

func httpSession(t *testing.T, endpoint, key string) *mcp.ClientSession {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: withKey{key}}, MaxRetries: -1, DisableStandaloneSSE: true}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

func post(t *testing.T, endpoint, authorization, session, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestHTTPUsesTheCallersKey serves the tools over real HTTP: a request without a bearer key is
// refused, each agent's calls run with its own key (never a key of the server's), and a session
// cannot be used with another key.
func TestHTTPUsesTheCallersKey(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	api := env.Server(t)
	ctx := context.Background()
	srv := httptest.NewServer(mcptools.HTTPHandler(func(key string) (*client.Client, error) {
		return client.New(api, client.WithAPIKey(key))
	}, "test"))
	t.Cleanup(srv.Close)

	// No key, or not a bearer one: 401 with a JSON-RPC error that says what to send.
	for _, authz := range []string{"", "Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer a b", env.RootKey} {
		resp := post(t, srv.URL, authz, "", initialize)
		b, _ := io.ReadAll(resp.Body)
		var rpc struct {
			JSONRPC string `json:"jsonrpc"`
			Error   struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(b, &rpc) != nil || rpc.JSONRPC != "2.0" ||
			!strings.Contains(rpc.Error.Message, "Authorization: Bearer") || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("Authorization %q = %d %s %q", authz, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b)
		}
	}

	// An agent that may only read pools.
	bot, _ := env.IAM.CreateIdentity(ctx, "root", iam.KindAgent, "reader")
	role, _ := env.IAM.CreateRole(ctx, "root", "pool-reader", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:pools:list", "compute:pools:get"}, Resources: []string{"*"}}}})
	if err := env.IAM.Bind(ctx, bot.ID, role.ID, "root"); err != nil {
		t.Fatal(err)
	}
	reader, _ := env.IAM.CreateAPIKey(ctx, bot.ID, "mcp", time.Time{})

	cs := httpSession(t, srv.URL, reader.Token)
	if r := call(t, cs, "pools_list", map[string]any{}); r.IsError || !strings.Contains(text(r), `"items"`) {
		t.Fatalf("pools_list with the reader's key = %s", text(r))
	}
	if r := call(t, cs, "pools_create", map[string]any{"name": "h100"}); !r.IsError || !strings.Contains(text(r), "permission_denied") {
		t.Fatalf("pools_create with the reader's key = %s", text(r))
	}
	// The administrator's key, in its own session, may create.
	admin := httpSession(t, srv.URL, env.RootKey)
	if r := call(t, admin, "pools_create", map[string]any{"name": "h100"}); r.IsError {
		t.Fatalf("pools_create with the root key = %s", text(r))
	}
	// A key the API does not know: its calls are unauthenticated.
	stranger := httpSession(t, srv.URL, "biam_key_wrong")
	if r := call(t, stranger, "pools_list", map[string]any{}); !r.IsError || !strings.Contains(text(r), "unauthenticated") {
		t.Fatalf("pools_list with an unknown key = %s", text(r))
	}

	// A session opened with the reader's key refuses the root key, and no key at all.
	resp := post(t, srv.URL, "Bearer "+reader.Token, "", initialize)
	id := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize = %d, session %q", resp.StatusCode, id)
	}
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, srv.URL, nil)
		req.Header.Set("Authorization", "Bearer "+reader.Token)
		req.Header.Set("Mcp-Session-Id", id)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	create := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"pools_create","arguments":{"name":"a100"}}}`
	if resp := post(t, srv.URL, "Bearer "+env.RootKey, id, create); resp.StatusCode != http.StatusForbidden {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("another key on the reader's session = %d %s", resp.StatusCode, b)
	}
	if resp := post(t, srv.URL, "", id, create); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no key on the reader's session = %d", resp.StatusCode)
	}
	var pools int
	env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.pools`).Scan(&pools)
	if pools != 1 {
		t.Fatalf("%d pools, want only the root key's", pools)
	}
}
