package compute_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/embedded"
)

// ExampleNew embeds the control plane in a host application: open the database, run IAM
// in-process, construct (New checks every option and starts nothing), initialize (migrations,
// module checks), start, mount the handler, and call the API in-process and over HTTP.
func ExampleNew() {
	ctx := context.Background()

	// A production host opens its own database: postgres.Open(ctx, os.Getenv("BETTER_COMPUTE_DATABASE_URL")).
	// This example starts a private one.
	cluster, err := embedded.Start(ctx, embedded.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Stop(ctx)
	db, err := postgres.Open(ctx, cluster.URL("postgres"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	port, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "platform"})
	if err != nil {
		log.Fatal(err)
	}
	opts := compute.Options{
		Database:     db,
		Secret:       "too short",
		BaseURL:      "https://compute.example.com",
		RootTenantID: "platform",
		IAM:          port,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if _, err := compute.New(opts); errors.As(err, new(*compute.OptionError)) {
		fmt.Println("refused:", err)
	}
	opts.Secret = "an example secret of at least 32 characters"
	c, err := compute.New(opts)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Initialize(ctx); err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Stop(ctx)

	mux := http.NewServeMux()
	mux.Handle("/api/compute/", c.Handler)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// An operator's key, made through the embedded IAM's admin calls.
	key, err := port.CreateAdminKey(ctx, "platform", "ops")
	if err != nil {
		log.Fatal(err)
	}

	// In-process, typed.
	pool, err := c.API.Pools.Create(ctx, key.Token, api.CreatePool{Name: "h100", Description: "8×H100 SXM"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created pool", pool.Name, "in tenant", pool.TenantID)

	// Over HTTP, as any client would.
	req, _ := http.NewRequest("POST", srv.URL+"/api/compute/pools/get", strings.NewReader(`{"pool": "h100"}`))
	req.Header.Set("Authorization", "Bearer "+key.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("pools/get answered", resp.StatusCode)

	// A typed error with a stable code.
	_, err = c.API.Pools.Create(ctx, key.Token, api.CreatePool{Name: "h100"})
	fmt.Println("again:", api.CodeOf(err))
	// Output:
	// refused: compute: Options.Secret must be at least 32 characters, got 9
	// created pool h100 in tenant platform
	// pools/get answered 200
	// again: conflict
}
