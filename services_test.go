package compute_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/modules"
)

// A module that books GPUs for its own method, through modules.Runtime only.
type placeOrder struct {
	Pool string `json:"pool"`
	GPUs int    `json:"gpus"`
	Fail bool   `json:"fail,omitempty"` // fail after booking
}

type order struct {
	Reservation string    `json:"reservation"`
	At          time.Time `json:"at"`
}

var ordersPlace = api.NewMethod[placeOrder, order]("orders", "place", true, "test-order", "v0.1", "Book GPUs for an order.")
var ordersCancel = api.NewMethod[api.GetReservation, order]("orders", "cancel", true, "test-order", "v0.1", "Release an order's GPUs.")

type orders struct{}

func (orders) Name() string { return "orders" }

func (orders) Register(r *modules.Registry) error {
	r.ResourceTypes(iam.ResourceType{Name: "test-order"})
	r.Actions(modules.ActionsFor(ordersPlace.Info(), ordersCancel.Info())...)
	r.EventTypes(modules.EventType{Name: "order.placed"})
	modules.Handle(r, ordersPlace, nil, func(ctx context.Context, c *modules.Call, in placeOrder) (order, error) {
		rt := c.Runtime
		res, err := rt.Capacity.Reserve(ctx, c, api.CreateReservation{Pool: in.Pool, Shape: api.Shape{GPUs: in.GPUs}, Duration: "1h"})
		if err != nil {
			return order{}, err
		}
		if in.Fail {
			return order{}, errors.New("the order failed after booking")
		}
		at, err := rt.Clock.Now(ctx, c.Tx)
		if err != nil {
			return order{}, err
		}
		if err := rt.Events.Emit(ctx, c.Tx, modules.Event{Type: "order.unregistered", TenantID: c.Target.TenantID, Subject: res.ID}); err == nil {
			return order{}, errors.New("an event of an unregistered type was written")
		}
		return order{Reservation: res.ID, At: at}, rt.Events.Emit(ctx, c.Tx, modules.Event{Type: "order.placed", TenantID: c.Target.TenantID, Subject: res.ID})
	})
	modules.Handle(r, ordersCancel, nil, func(ctx context.Context, c *modules.Call, in api.GetReservation) (order, error) {
		return order{Reservation: in.Reservation}, c.Runtime.Capacity.Release(ctx, c, in.Reservation)
	})
	return nil
}

// TestRuntimeServices checks the services a module gets: it books capacity in its own call's
// transaction (rolled back with it), releases it, reads the clock, emits only registered
// events, and seals secrets bound to their purpose.
func TestRuntimeServices(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleetWith(t, computetest.Options{Modules: []compute.Module{orders{}}})
	env, ctx := ff.env, context.Background()
	call := func(in placeOrder) (order, error) {
		return compute.Invoke(ctx, env.Compute, env.RootKey, ordersPlace, in)
	}
	if _, err := call(placeOrder{Pool: "p1", GPUs: 2, Fail: true}); api.CodeOf(err) != api.CodeInternal {
		t.Fatalf("the failing order = %v, want internal", err)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.reservations"); n != 0 {
		t.Fatalf("a failed order left %d reservations", n)
	}
	o, err := call(placeOrder{Pool: "p1", GPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if o.At.IsZero() {
		t.Fatal("the clock read nothing")
	}
	r, err := env.Compute.API.Reservations.Get(ctx, env.RootKey, api.GetReservation{Reservation: o.Reservation})
	if err != nil || r.State != api.ReservationActive || len(r.Allocations[0].GPUs) != 2 {
		t.Fatalf("the order's reservation = %+v, %v", r, err)
	}
	if n := computetest.Count(t, env.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'order.placed' AND subject = $1`, o.Reservation); n != 1 {
		t.Fatalf("order.placed events = %d, want 1", n)
	}
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, ordersCancel, api.GetReservation{Reservation: "not-an-id"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("a module releasing a reservation by a non-id = %v, want not_found", err)
	}
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, ordersCancel, api.GetReservation{Reservation: o.Reservation}); err != nil {
		t.Fatal(err)
	}
	if r, _ := env.Compute.API.Reservations.Get(ctx, env.RootKey, api.GetReservation{Reservation: o.Reservation}); r.State != api.ReservationReleased {
		t.Fatalf("after the module released it the reservation is %s", r.State)
	}
	if d, err := capacity.Drift(ctx, env.DB.Pool); err != nil || len(d) != 0 {
		t.Fatalf("drift: %v %v", d, err)
	}

	box := env.Compute.Runtime().Secrets
	sealed, err := box.Seal("bmc-password", []byte("hunter2"))
	if err != nil || bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatalf("seal = %x, %v", sealed, err)
	}
	if got, err := box.Open("bmc-password", sealed); err != nil || string(got) != "hunter2" {
		t.Fatalf("open = %q, %v", got, err)
	}
	if _, err := box.Open("provider-token", sealed); err == nil {
		t.Fatal("a secret sealed for one purpose opened for another")
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := box.Open("bmc-password", sealed); err == nil {
		t.Fatal("a damaged secret opened")
	}
}
