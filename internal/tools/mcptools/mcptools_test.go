package mcptools_test

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/examples/pingmodule"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/tools/mcptools"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// session connects an SDK client to the tools, which call a real control plane with key.
func session(t *testing.T, url, key string) *mcp.ClientSession {
	t.Helper()
	cl, err := client.New(url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := mcptools.New(context.Background(), cl, "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestToolsMatchTheTableAndAgentsWaitForConfirmation(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	ctx := context.Background()

	// A person, Ada, and her agent, which may do anything with pools but must ask her before it
	// creates anything.
	ada, err := env.IAM.CreateIdentity(ctx, "root", iam.KindUser, "ada")
	if err != nil {
		t.Fatal(err)
	}
	bot, _ := env.IAM.CreateIdentity(ctx, "root", iam.KindAgent, "ada-bot")
	role, _ := env.IAM.CreateRole(ctx, "root", "pools", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:pools:*"}, Resources: []string{"*"}}}})
	if err := env.IAM.Bind(ctx, bot.ID, role.ID, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.IAM.CreateDelegation(ctx, "root", ada.ID, bot.ID, []string{"compute:*:create"}); err != nil {
		t.Fatal(err)
	}
	key, _ := env.IAM.CreateAPIKey(ctx, bot.ID, "mcp", time.Time{})
	cs := session(t, url, key.Token)

	// One tool per method of the table, with a schema.
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, tl := range tools.Tools {
		got = append(got, tl.Name)
		if tl.InputSchema == nil {
			t.Errorf("tool %s has no input schema", tl.Name)
		}
	}
	for _, m := range api.Methods() {
		want = append(want, mcptools.ToolName(m))
	}
	sort.Strings(got)
	sort.Strings(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("tools differ from the method table (-want +got):\n%s", diff)
	}

	// A read runs directly.
	if r := call(t, cs, "pools_list", map[string]any{}); r.IsError || !strings.Contains(text(r), `"items"`) {
		t.Fatalf("pools_list = %v %s", r.IsError, text(r))
	}
	// A create waits for Ada.
	r := call(t, cs, "pools_create", map[string]any{"name": "h100"})
	var out struct {
		Error api.Error `json:"error"`
	}
	b, _ := json.Marshal(r.StructuredContent)
	json.Unmarshal(b, &out)
	if !r.IsError || out.Error.Code != api.CodeConfirmationRequired {
		t.Fatalf("pools_create before confirmation = %s", text(r))
	}
	id, _ := out.Error.Details["confirmationId"].(string)
	if id == "" || !strings.Contains(text(r), id) {
		t.Fatalf("no confirmation id: %s", text(r))
	}
	// Asking again before Ada answers points at the same confirmation.
	r = call(t, cs, "pools_create", map[string]any{"name": "h100"})
	if !strings.Contains(text(r), id) {
		t.Fatalf("a second request opened another confirmation: %s", text(r))
	}
	// Someone else cannot approve it.
	other, _ := env.IAM.CreateIdentity(ctx, "root", iam.KindUser, "eve")
	if err := env.IAM.DecideConfirmation(ctx, id, other.ID, true); err == nil {
		t.Fatal("a person who did not delegate approved the confirmation")
	}
	if err := env.IAM.DecideConfirmation(ctx, id, ada.ID, true); err != nil {
		t.Fatal(err)
	}
	// Approved: it runs, once.
	if r := call(t, cs, "pools_create", map[string]any{"name": "h100"}); r.IsError || !strings.Contains(text(r), `"name":"h100"`) {
		t.Fatalf("pools_create after approval = %s", text(r))
	}
	r = call(t, cs, "pools_create", map[string]any{"name": "a100"})
	if !r.IsError || !strings.Contains(text(r), "confirmation_required") {
		t.Fatalf("a second create on one confirmation = %s", text(r))
	}
	var pools int
	env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.pools`).Scan(&pools)
	if pools != 1 {
		t.Fatalf("%d pools exist, want the one confirmed", pools)
	}
	// Mutations not in the delegation's list need no confirmation.
	if r := call(t, cs, "pools_update", map[string]any{"pool": "h100", "description": "eight H100s"}); r.IsError {
		t.Fatalf("pools_update = %s", text(r))
	}
	// Bad arguments are a tool error, not a crash.
	if r := call(t, cs, "pools_get", map[string]any{"pool": 7}); !r.IsError || !strings.Contains(text(r), "invalid_argument") {
		t.Fatalf("pools_get with a number = %s", text(r))
	}
}

// TestModuleMethodsAreTools checks that a module's methods, which this binary has no Go types
// for, are tools too: with the server's schema, their arguments passed to the server, which
// decodes them as strictly as any body.
func TestModuleMethodsAreTools(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{pingmodule.Module{}}})
	cs := session(t, env.Server(t), env.RootKey)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var send *mcp.Tool
	for _, tl := range tools.Tools {
		if tl.Name == "pings_send" {
			send = tl
		}
	}
	if send == nil {
		t.Fatal("no pings_send tool")
	}
	if schema, _ := json.Marshal(send.InputSchema); !strings.Contains(string(schema), `"message"`) {
		t.Fatalf("pings_send's schema %s does not describe its input", schema)
	}
	if r := call(t, cs, "pings_get", map[string]any{"ping": "0190a0b0-0000-7000-8000-000000000001"}); !r.IsError || !strings.HasPrefix(text(r), "not_found") {
		t.Fatalf("pings_get of nothing = %v %s, want not_found", r.IsError, text(r))
	}
	if r := call(t, cs, "pings_get", map[string]any{"ping": "x", "nope": 1}); !r.IsError || !strings.Contains(text(r), "nope") {
		t.Fatalf("pings_get with an unknown field = %v %s, want invalid_argument naming it", r.IsError, text(r))
	}
}
