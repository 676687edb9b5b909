package pingmodule_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/examples/pingmodule"
	"github.com/better-compute/compute/sim"
)

// ExampleModule runs the module's two halves: Module in the control plane's Options.Modules
// (its Register declares the pings methods, its tables and the ping.echo command kind) and
// NodeSide's extension in a node's agent, here a simulated node's. The module's method sends
// the node a ping.echo command, which the node answers.
func ExampleModule() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dev, err := devserver.Start(ctx, devserver.Options{Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Embedded: true,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modules: func(string) ([]compute.Module, error) { return []compute.Module{pingmodule.Module{}}, nil }})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Stop(context.Background())

	// One simulated node, its agent carrying the module's node side.
	a := dev.Compute.API
	if _, err := a.Pools.Create(ctx, dev.APIKey, api.CreatePool{Name: "edge"}); err != nil {
		log.Fatal(err)
	}
	token, err := a.JoinTokens.Create(ctx, dev.APIKey, api.CreateJoinToken{Pool: "edge"})
	if err != nil {
		log.Fatal(err)
	}
	side := &pingmodule.NodeSide{}
	fleet, err := sim.Start(ctx, sim.Options{URL: dev.URL, Gateway: dev.Gateway, Token: token.Token, Nodes: 1,
		Extensions: []ext.Extension{side.Extension()}})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Stop()
	if err := fleet.WaitConnected(ctx); err != nil {
		log.Fatal(err)
	}

	// The module's method, called as any core method is.
	ping, err := compute.Invoke(ctx, dev.Compute, dev.APIKey, pingmodule.PingsSend,
		pingmodule.Send{Node: fleet.Nodes[0].NodeID(), Message: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent", ping.Message)

	// Wait for the command to finish, on the event stream, then read the node's answer.
	c, err := client.New(dev.URL, client.WithAPIKey(dev.APIKey))
	if err != nil {
		log.Fatal(err)
	}
	finished := errors.New("finished")
	err = c.WatchEvents(ctx, client.WatchOptions{Type: "command.finished", Subject: ping.CommandID},
		func(api.Event) error { return finished })
	if !errors.Is(err, finished) {
		log.Fatal(err)
	}
	cmd, err := a.Commands.Get(ctx, dev.APIKey, api.GetCommand{Command: ping.CommandID})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(cmd.Kind, cmd.State, string(cmd.Result))
	// Output:
	// sent hello
	// ping.echo succeeded {"echo": "hello", "secretBytes": 0}
}
