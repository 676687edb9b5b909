package compute_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
)

var zeroTime time.Time

func TestPoolsCRUDAndPagination(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := context.Background()
	a := env.Compute.API
	site, err := a.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "fra1", DisplayName: "Frankfurt 1"})
	if err != nil {
		t.Fatal(err)
	}
	var created []api.Pool
	for i := range 7 {
		p, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: fmt.Sprintf("pool-%d", i), Site: "fra1", Labels: map[string]string{"i": fmt.Sprint(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if p.SiteID != site.ID || p.TenantID != "root" {
			t.Fatalf("pool %+v: want site %s, tenant root", p, site.ID)
		}
		created = append(created, p)
	}
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "pool-0"}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a second pool-0 = %v, want conflict", err)
	}
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "x", Site: "nowhere"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("a pool on a missing site = %v, want not_found", err)
	}

	// Three pages of 3, 3 and 1, in creation order, with no pool twice.
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		pg, err := a.Pools.List(ctx, env.RootKey, api.ListPools{PageRequest: api.PageRequest{Limit: 3, Cursor: cursor}})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pg.Items {
			got = append(got, p.Name)
		}
		if pg.NextCursor == "" {
			if pages != 2 {
				t.Fatalf("listed in %d pages, want 3", pages+1)
			}
			break
		}
		cursor = pg.NextCursor
	}
	want := []string{"pool-0", "pool-1", "pool-2", "pool-3", "pool-4", "pool-5", "pool-6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pages gave %v, want %v", got, want)
	}

	byID, err := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: created[3].ID})
	if err != nil || byID.Name != "pool-3" {
		t.Fatalf("get by id = %+v, %v", byID, err)
	}
	desc := "eight GPUs a node"
	up, err := a.Pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "pool-3", Description: &desc})
	if err != nil || up.Description != desc || up.Labels["i"] != "3" {
		t.Fatalf("update = %+v, %v; want the description set and the labels kept", up, err)
	}
	if _, err := a.Sites.Delete(ctx, env.RootKey, api.DeleteSite{Site: "fra1"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("deleting a site with pools = %v, want failed_precondition", err)
	}
	if _, err := a.Pools.Delete(ctx, env.RootKey, api.DeletePool{Pool: "pool-3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: "pool-3"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("get after delete = %v, want not_found", err)
	}
}

func TestPoolWithNodesCannotBeDeleted(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := context.Background()
	a := env.Compute.API
	p, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: p.ID, Name: "gpu-001"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Pools.Delete(ctx, env.RootKey, api.DeletePool{Pool: "h100"})
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("deleting a pool with a node = %v, want failed_precondition", err)
	}
	got, err := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: "h100"})
	if err != nil || got.NodeCount != 1 {
		t.Fatalf("pool after the refused delete = %+v, %v", got, err)
	}

	node, err := a.Nodes.Get(ctx, env.RootKey, api.GetNode{Pool: "h100", Node: "gpu-001"})
	if err != nil || node.ID != n.ID || node.State != api.NodeActive || node.Status != api.NodeOffline {
		t.Fatalf("nodes.get = %+v, %v", node, err)
	}
	if _, err := a.Nodes.Get(ctx, env.RootKey, api.GetNode{Node: "gpu-001"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("nodes.get by name without a pool = %v, want invalid_argument", err)
	}
	list, err := a.Nodes.List(ctx, env.RootKey, api.ListNodes{Pool: "h100", State: api.NodeActive})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("nodes.list = %+v, %v", list, err)
	}
	list, err = a.Nodes.List(ctx, env.RootKey, api.ListNodes{State: api.NodeRetired})
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("nodes.list of retired nodes = %+v, %v", list, err)
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := context.Background()
	a := env.Compute.API
	tenantA, keyA := env.Tenant(t, "tenant-a")
	tenantB, keyB := env.Tenant(t, "tenant-b")
	poolB, err := a.Pools.Create(ctx, keyB, api.CreatePool{Name: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	if poolB.TenantID != tenantB {
		t.Fatalf("B's pool is in tenant %s", poolB.TenantID)
	}
	desc := "mine now"
	for name, err := range map[string]error{
		"get by id":          second(a.Pools.Get(ctx, keyA, api.GetPool{Pool: poolB.ID})),
		"get by name in B":   second(a.Pools.Get(ctx, keyA, api.GetPool{TenantID: tenantB, Pool: "secret"})),
		"update by id":       second(a.Pools.Update(ctx, keyA, api.UpdatePool{Pool: poolB.ID, Description: &desc})),
		"delete by id":       second(a.Pools.Delete(ctx, keyA, api.DeletePool{Pool: poolB.ID})),
		"list B's pools":     second(a.Pools.List(ctx, keyA, api.ListPools{TenantID: tenantB})),
		"create a pool in B": second(a.Pools.Create(ctx, keyA, api.CreatePool{TenantID: tenantB, Name: "intruder"})),
	} {
		code := api.CodeOf(err)
		if code != api.CodeNotFound && code != api.CodePermissionDenied {
			t.Errorf("A %s: %v, want not_found or permission_denied", name, err)
		}
	}
	// A's own name lookup does not see B's pool.
	if _, err := a.Pools.Get(ctx, keyA, api.GetPool{Pool: "secret"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("A get \"secret\" in its own tenant = %v, want not_found", err)
	}
	// Not found reads the same whether the pool is B's or does not exist at all.
	_, errB := a.Pools.Get(ctx, keyA, api.GetPool{Pool: poolB.ID})
	_, errNone := a.Pools.Get(ctx, keyA, api.GetPool{Pool: fleet.NewID()})
	if errB.(*api.Error).Message != fmt.Sprintf("pool %q not found", poolB.ID) || api.CodeOf(errNone) != api.CodeNotFound {
		t.Errorf("B's pool reads %v; a missing one %v", errB, errNone)
	}
	list, err := a.Pools.List(ctx, keyA, api.ListPools{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("A lists %+v, %v; want nothing", list, err)
	}
	got, err := a.Pools.Get(ctx, keyB, api.GetPool{Pool: "secret"})
	if err != nil || got.Description != "" {
		t.Fatalf("B's pool after A's attempts = %+v, %v; want it unchanged", got, err)
	}
	// The root tenant's key reaches into its descendants.
	if _, err := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: poolB.ID}); err != nil {
		t.Fatalf("root get B's pool: %v", err)
	}
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{TenantID: tenantA, Name: "given"}); err != nil {
		t.Fatalf("root creates a pool in A: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }
