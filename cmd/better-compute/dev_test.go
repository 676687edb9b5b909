package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/devserver"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestDevSimIsReadyWhenCapacityIs: once the devserver with simulated nodes says it is up (what
// `dev --sim N` prints its banner after), the nodes' GPUs are counted and schedulable, so the
// first request for a whole node succeeds. It starts the devserver a few times, because the
// inventory racing the banner was lost only sometimes.
func TestDevSimIsReadyWhenCapacityIs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the devserver with simulated nodes")
	}
	for i := range 3 {
		t.Setenv(postgres.EnvDatabaseURL, pgtest.URL(t))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := devserver.Start(ctx, devserver.Options{Sim: 2, Addr: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		sum, err := s.Compute.API.Capacity.Summary(ctx, s.APIKey, api.SummarizeCapacity{Pool: devserver.SimPool})
		total := 0
		for _, m := range sum.Models {
			total += m.Total
		}
		if err != nil || sum.Schedulable != 2 || total != 16 {
			t.Errorf("start %d: capacity when ready = %+v, %v; want 2 schedulable nodes with 16 GPUs", i, sum, err)
		}
		r, err := s.Compute.API.Reservations.Create(ctx, s.APIKey, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 8}})
		if err != nil || r.State != api.ReservationActive {
			t.Errorf("start %d: the first 8-GPU reservation = %+v, %v", i, r, err)
		}
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		cancel()
	}
}
