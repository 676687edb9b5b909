package compute_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/embedded"
)

// ExampleInvokeTx calls a method inside the host's own transaction: the pool it creates commits or
// rolls back with the host's row. c.API.Pools.CreateTx is the same call, typed.
func ExampleInvokeTx() {
	ctx := context.Background()
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
	c, err := compute.New(compute.Options{Database: db, Secret: "an example secret of at least 32 characters",
		BaseURL: "https://compute.example.com", RootTenantID: "platform", IAM: port,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Initialize(ctx); err != nil {
		log.Fatal(err)
	}
	key, err := port.CreateAdminKey(ctx, "platform", "ops")
	if err != nil {
		log.Fatal(err)
	}

	// The host's own table: a team gets a pool of its own.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.teams (name text PRIMARY KEY, pool_id uuid NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	addTeam := func(name string, commit bool) {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback(ctx)
		pool, err := compute.InvokeTx(ctx, c, tx, key.Token, api.PoolsCreate, api.CreatePool{Name: name})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO public.teams VALUES ($1, $2)`, name, pool.ID); err != nil {
			log.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				log.Fatal(err)
			}
		}
	}
	addTeam("research", true)
	addTeam("abandoned", false) // rolled back: neither the team nor its pool is kept

	_, err = c.API.Pools.Get(ctx, key.Token, api.GetPool{Pool: "research"})
	fmt.Println("research's pool kept:", err == nil)
	_, err = c.API.Pools.Get(ctx, key.Token, api.GetPool{Pool: "abandoned"})
	fmt.Println("abandoned's pool:", api.CodeOf(err))
	// Output:
	// research's pool kept: true
	// abandoned's pool: not_found
}
