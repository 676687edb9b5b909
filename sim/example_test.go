package sim_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/sim"
)

// ExampleStart joins three simulated GPU machines into a pool of a running control plane (here a
// development server), each a real node agent holding a real session with the gateway, and lists
// the pool's nodes.
func ExampleStart() {
	ctx := context.Background()
	dev, err := devserver.Start(ctx, devserver.Options{Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Embedded: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Stop(ctx)

	// The nodes join with a join token of the pool, as bcd would.
	a := dev.Compute.API
	if _, err := a.Pools.Create(ctx, dev.APIKey, api.CreatePool{Name: "edge"}); err != nil {
		log.Fatal(err)
	}
	token, err := a.JoinTokens.Create(ctx, dev.APIKey, api.CreateJoinToken{Pool: "edge", MaxUses: 3})
	if err != nil {
		log.Fatal(err)
	}

	fleet, err := sim.Start(ctx, sim.Options{URL: dev.URL, Gateway: dev.Gateway, Token: token.Token,
		Nodes: 3, GPUs: 8, Prefix: "edge"})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Stop()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := fleet.WaitConnected(wait); err != nil {
		log.Fatal(err)
	}

	nodes, err := a.Nodes.List(ctx, dev.APIKey, api.ListNodes{Pool: "edge"})
	if err != nil {
		log.Fatal(err)
	}
	for _, n := range nodes.Items { // in the order they joined, which they did in parallel
		fmt.Println(n.Name, n.State)
	}
	// Unordered output:
	// edge-00000 active
	// edge-00001 active
	// edge-00002 active
}
