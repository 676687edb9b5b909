package pingmodule_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/examples/pingmodule"
	"github.com/better-compute/compute/postgres/pgtest"
	"github.com/better-compute/compute/sim"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestModuleEndToEnd runs a control plane with the ping module, a gateway on loopback and a
// simulated node carrying the module's extension: the module's method writes its table, sends
// its command kind (which the node carries out), emits its event, and moves its desired-state
// kind (which the node converges); bad input and another tenant's node are refused. No core
// package knows of the module.
func TestModuleEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{pingmodule.Module{}},
		Configure: func(o *compute.Options) { o.HeartbeatInterval = 200 * time.Millisecond }})
	url := env.Server(t)
	gw, stop := env.Gateway(t, "")
	defer stop()
	a := env.Compute.API
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "edge"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	side := &pingmodule.NodeSide{}
	f, err := sim.Start(ctx, sim.Options{URL: url, Token: jt.Token, Gateway: gw, Nodes: 1, GPUs: 1, Prefix: "edge",
		Extensions: []ext.Extension{side.Extension()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(wctx); err != nil {
		t.Fatal(err)
	}
	node := f.Nodes[0].NodeID()

	// The module's method, its table, its command kind carried out by the node, its event.
	p, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsSend, pingmodule.Send{Node: node, Message: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	var last api.Command
	computetest.Eventually(t, 30*time.Second, "the node to answer ping.echo", func() bool {
		var err error
		last, err = a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: p.CommandID})
		if err != nil || last.State == api.CommandFailed {
			t.Fatalf("ping.echo = %+v, %v", last, err)
		}
		return last.State == api.CommandSucceeded
	})
	var answer struct{ Echo string }
	if err := json.Unmarshal(last.Result, &answer); err != nil || answer.Echo != "hello" {
		t.Fatalf("ping.echo answered %s, want the message back", last.Result)
	}
	got, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsGet, pingmodule.Get{Ping: p.ID})
	if err != nil || got != p {
		t.Fatalf("pings.get = %+v, %v; want %+v", got, err, p)
	}
	var events int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.events WHERE type = 'ping.sent' AND subject = $1`, p.ID).Scan(&events); err != nil || events != 1 {
		t.Fatalf("ping.sent events = %d, %v; want 1", events, err)
	}

	// A write-only secret reaches the node with its command, and no answer shows it.
	const secret = "hunter2-bmc-password"
	p2, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsSend, pingmodule.Send{Node: node, Message: "with a secret", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, "the node to answer the ping with a secret", func() bool {
		last, err = a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: p2.CommandID})
		return err == nil && last.State == api.CommandSucceeded
	})
	if side.Secret() != secret {
		t.Fatalf("the node got secret %q, want %q", side.Secret(), secret)
	}
	if b, _ := json.Marshal(last); strings.Contains(string(b), "hunter2") || last.SecretSet {
		t.Fatalf("a finished command shows or keeps its secret: %s", b)
	}
	var stored int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.commands WHERE secret IS NOT NULL OR args::text LIKE '%hunter2%'`).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("commands still holding a secret = %d, %v; want none once finished", stored, err)
	}

	// Its report kind: a pong from the node becomes an event; a refused report says why and is
	// not retried; a kind nobody registered is refused.
	if err := f.Nodes[0].Reports.Report(ctx, pingmodule.ReportPong, map[string]string{"message": "pong!"}); err != nil {
		t.Fatal(err)
	}
	var pongs int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.events WHERE type = 'ping.ponged' AND subject = $1 AND data->>'message' = 'pong!'`, node).Scan(&pongs); err != nil || pongs != 1 {
		t.Fatalf("ping.ponged events after the report = %d, %v; want 1 (a report returns once recorded)", pongs, err)
	}
	for _, bad := range []struct {
		kind, want string
		payload    any
	}{
		{pingmodule.ReportPong, "a pong needs a message", map[string]string{}},
		{"ping.unknown", `no module registered report kind "ping.unknown"`, map[string]string{"message": "x"}},
	} {
		err := f.Nodes[0].Reports.Report(ctx, bad.kind, bad.payload)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Fatalf("report %s %v = %v, want a refusal saying %q", bad.kind, bad.payload, err, bad.want)
		}
	}

	// Its desired-state kind: the node converges the banner, and a change of it.
	for _, banner := range []string{"welcome", "maintenance at noon"} {
		if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsSetBanner, pingmodule.SetBanner{Node: node, Banner: banner}); err != nil {
			t.Fatal(err)
		}
		computetest.Eventually(t, 30*time.Second, "the node to show "+banner, func() bool { return side.Banner() == banner })
	}

	// Bad input names the field; a command kind's own check runs; another tenant sees no node.
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsGet, pingmodule.Get{Ping: "x"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("pings.get of a non-id = %v, want invalid_argument", err)
	}
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, pingmodule.PingsSend, pingmodule.Send{Node: node}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a ping without a message = %v, want invalid_argument", err)
	}
	if _, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node}, Kind: pingmodule.CommandEcho}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("ping.echo without args.message = %v, want invalid_argument", err)
	}
	_, otherKey := env.Tenant(t, "other")
	if _, err := compute.Invoke(ctx, env.Compute, otherKey, pingmodule.PingsSetBanner, pingmodule.SetBanner{Node: node, Banner: "x"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("another tenant's banner on the node = %v, want not_found", err)
	}
	if side.Banner() != "maintenance at noon" {
		t.Fatalf("the refused call changed the banner to %q", side.Banner())
	}

	// Its methods are in the served method table, beside the core's.
	var listed int
	for _, m := range env.Compute.Methods() {
		if m.Group == "pings" {
			listed++
		}
	}
	if listed != 3 {
		t.Fatalf("the method table lists %d pings methods, want 3", listed)
	}
}
