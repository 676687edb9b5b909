package compute_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
)

// TestCreateTxCommitsAndRollsBackWithTheHost checks that a host can reserve GPUs atomically with
// its own rows: a host transaction that fails after CreateTx leaves no reservation, no booking and
// no host row; one that commits keeps all three; a refused call inside it leaves it usable.
func TestCreateTxCommitsAndRollsBackWithTheHost(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env, ctx := ff.env, context.Background()
	if _, err := env.DB.Pool.Exec(ctx, `CREATE TABLE public.orders (id serial PRIMARY KEY, reservation_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	a := env.Compute.API
	order := func(tx pgx.Tx, gpus int) (api.Reservation, error) {
		r, err := a.Reservations.CreateTx(ctx, tx, env.RootKey, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: gpus}, Duration: "1h"})
		if err != nil {
			return r, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO public.orders (reservation_id) VALUES ($1)`, r.ID)
		return r, err
	}
	counts := func() (orders, reservations, bookings int) {
		t.Helper()
		err := env.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.orders), (SELECT count(*) FROM compute.reservations),
			(SELECT count(*) FROM compute.bookings)`).Scan(&orders, &reservations, &bookings)
		if err != nil {
			t.Fatal(err)
		}
		return
	}

	// The host fails after the reservation: everything goes.
	errHost := errors.New("the host's payment failed")
	env.Counter.Reset()
	err := pgx.BeginFunc(ctx, env.DB.Pool, func(tx pgx.Tx) error {
		if _, err := order(tx, 3); err != nil {
			return err
		}
		return errHost
	})
	if !errors.Is(err, errHost) {
		t.Fatalf("host transaction = %v, want the host's own error", err)
	}
	if n := len(env.Counter.Decisions()); n != 1 {
		t.Fatalf("CreateTx made %d IAM decisions, want 1", n)
	}
	if o, r, b := counts(); o+r+b != 0 {
		t.Fatalf("after the rollback: %d orders, %d reservations, %d bookings; want none", o, r, b)
	}

	// A refused call (no room) inside the host's transaction leaves it usable; the rest commits.
	var kept api.Reservation
	err = pgx.BeginFunc(ctx, env.DB.Pool, func(tx pgx.Tx) error {
		if _, err := order(tx, 9); api.CodeOf(err) != api.CodeConflict {
			t.Errorf("9 GPUs of 8 = %v, want conflict (no room)", err)
		}
		var err error
		kept, err = order(tx, 3)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if o, r, b := counts(); o != 1 || r != 1 || b == 0 {
		t.Fatalf("after the commit: %d orders, %d reservations, %d bookings; want 1, 1 and its bookings", o, r, b)
	}
	if n := len(kept.Allocations[0].GPUs); n != 3 {
		t.Fatalf("the committed reservation holds %d GPUs, want 3", n)
	}
	got, err := a.Reservations.Get(ctx, env.RootKey, api.GetReservation{Reservation: kept.ID})
	if err != nil || got.State != api.ReservationActive {
		t.Fatalf("the committed reservation = %+v, %v", got, err)
	}
	if d, err := capacity.Drift(ctx, env.DB.Pool); err != nil || len(d) != 0 {
		t.Fatalf("rollup drift after CreateTx: %v, %v", d, err)
	}

	// Placement needs READ COMMITTED; anything else is refused before the method runs.
	tx, err := env.DB.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := order(tx, 1); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("CreateTx in a REPEATABLE READ transaction = %v, want failed_precondition", err)
	}
}
