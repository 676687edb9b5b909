package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/devserver"
)

// ExampleNew calls a control plane over HTTP: the same methods and types as the in-process API,
// and errors that carry their code.
func ExampleNew() {
	ctx := context.Background()

	// A development server stands in for the control plane; a client needs only its URL and a key.
	dev, err := devserver.Start(ctx, devserver.Options{Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0", Embedded: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Stop(ctx)

	c, err := client.New(dev.URL, client.WithAPIKey(dev.APIKey))
	if err != nil {
		log.Fatal(err)
	}
	pool, err := c.Pools.Create(ctx, api.CreatePool{Name: "h100", Description: "8×H100 SXM"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created pool", pool.Name)

	_, err = c.Pools.Create(ctx, api.CreatePool{Name: "h100"})
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		fmt.Println("again:", apiErr.Code)
	}

	pools, err := c.Pools.List(ctx, api.ListPools{})
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range pools.Items {
		fmt.Println("listed", p.Name, p.Description)
	}
	// Output:
	// created pool h100
	// again: conflict
	// listed h100 8×H100 SXM
}
