package nodes_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestCordonDrainRetire(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	a := env.Compute.API
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	pool, _ := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: "p"})
	var ids []string
	for i := range 2 {
		n, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: pool.ID, Name: fmt.Sprintf("n%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		env.DB.Pool.Exec(ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, n.ID)
		inv := capacity.Inventory{}
		for g := range 4 {
			inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("u%d%d", i, g), Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559})
		}
		if err := capacity.SetInventory(ctx, env.DB.Pool, n.ID, inv); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID)
	}
	ref := func(i int) api.NodeRef { return api.NodeRef{Node: ids[i]} }
	if n, err := a.Nodes.Cordon(ctx, env.RootKey, api.CordonNode{NodeRef: ref(0)}); err != nil || n.State != api.NodeCordoned {
		t.Fatalf("cordon = %+v, %v", n, err)
	}
	// A cordoned node takes nothing: 4 GPUs fit only on the other.
	r, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "p", Shape: api.Shape{GPUs: 4}})
	if err != nil || r.Allocations[0].NodeID != ids[1] {
		t.Fatalf("reservation = %+v, %v; want node 1", r, err)
	}
	if _, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "p", Shape: api.Shape{GPUs: 1}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("with one node cordoned and the other full = %v, want conflict", err)
	}
	// Retiring a node that holds something is refused; draining with end frees it first.
	if _, err := a.Nodes.Retire(ctx, env.RootKey, api.RetireNode{NodeRef: ref(1)}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("retire a node with a booking = %v", err)
	}
	if _, err := a.Nodes.Drain(ctx, env.RootKey, api.DrainNode{NodeRef: ref(1), End: true}); err != nil {
		t.Fatal(err)
	}
	got, _ := a.Reservations.Get(ctx, env.RootKey, api.GetReservation{Reservation: r.ID})
	if got.State != api.ReservationReleased {
		t.Fatalf("after drain with end, the reservation is %s", got.State)
	}
	if n, err := a.Nodes.Retire(ctx, env.RootKey, api.RetireNode{NodeRef: ref(1)}); err != nil || n.State != api.NodeRetired {
		t.Fatalf("retire = %+v, %v", n, err)
	}
	if _, err := a.Nodes.Uncordon(ctx, env.RootKey, api.UncordonNode{NodeRef: ref(1)}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("uncordon a retired node = %v", err)
	}
	if n, err := a.Nodes.Uncordon(ctx, env.RootKey, api.UncordonNode{NodeRef: ref(0)}); err != nil || n.State != api.NodeActive {
		t.Fatalf("uncordon = %+v, %v", n, err)
	}
	if n, err := a.Nodes.SetLabels(ctx, env.RootKey, api.SetNodeLabels{NodeRef: ref(0), Labels: map[string]string{"rack": "a1"}}); err != nil || n.Labels["rack"] != "a1" {
		t.Fatalf("setLabels = %+v, %v", n, err)
	}
	r2, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "p", Shape: api.Shape{GPUs: 1}, RequireLabels: map[string]string{"rack": "a1"}})
	if err != nil || r2.Allocations[0].NodeID != ids[0] {
		t.Fatalf("a reservation requiring the label = %+v, %v", r2, err)
	}
}

func TestJoinTokensListAndRevoke(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	a := env.Compute.API
	a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p"})
	tok, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "p", MaxUses: 3, TTL: "1h"})
	if err != nil || tok.Token == "" || tok.UsesLeft != 3 {
		t.Fatalf("create = %+v, %v", tok, err)
	}
	list, err := a.JoinTokens.List(ctx, env.RootKey, api.ListJoinTokens{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Token != "" {
		t.Fatalf("list = %+v, %v (the token must not be shown again)", list, err)
	}
	var stored []byte
	env.DB.Pool.QueryRow(ctx, `SELECT token_hash FROM compute.join_tokens`).Scan(&stored)
	if string(stored) == tok.Token {
		t.Fatal("the join token is stored in the clear")
	}
	rev, err := a.JoinTokens.Revoke(ctx, env.RootKey, api.RevokeJoinToken{Token: tok.ID})
	if err != nil || rev.RevokedAt == nil {
		t.Fatalf("revoke = %+v, %v", rev, err)
	}
	if _, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "p", TTL: "9999h"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a token for 9999h = %v", err)
	}
}
