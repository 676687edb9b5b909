package compute

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// gapPort is an IAM whose feed, when the follower first asks where it ends, has just had a
// binding written by another process, after a request of this one cached a denial.
type gapPort struct {
	*iam.Local
	gap    func()
	gapped atomic.Bool
	// following is closed when the follower first asks for the events after its cursor: it has
	// forgotten what it had to by then, and is following.
	following chan struct{}
	once      sync.Once
}

func (g *gapPort) Events(ctx context.Context, after int64, limit int) ([]iam.Event, int64, error) {
	if after < 0 && !g.gapped.Load() {
		g.gap()
		g.gapped.Store(true)
	}
	if after >= 0 {
		g.once.Do(func() { close(g.following) })
	}
	return g.Local.Events(ctx, after, limit)
}

// TestFollowerStartSeesEventsMeanwhile: the follower forgets everything when it starts and then
// follows; a binding written while it starts must still reach a denial cached meanwhile (the
// cause of TestBindingReachesCaches failing under load: the cursor was read after forgetting).
func TestFollowerStartSeesEventsMeanwhile(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := pgtest.New(t, postgres.Core, iam.Migrations)
	local, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root", CacheTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := local.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	svc, err := local.CreateIdentity(ctx, "root", iam.KindService, "reader")
	if err != nil {
		t.Fatal(err)
	}
	role, err := local.CreateRole(ctx, "root", "reader", iam.Policy{Version: 1, Statements: []iam.Statement{
		{Effect: iam.Allow, Actions: []string{"compute:pools:list"}, Resources: []string{"*"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cache := iam.NewDecisionCache(time.Hour, 100)
	p := iam.Principal{ID: svc.ID, KeyID: "key_1"}
	req := iam.Request{TenantID: "root", Action: "compute:pools:list", Resource: iam.Resource{Type: "compute-pool", ID: "*"}}
	port := &gapPort{Local: local, following: make(chan struct{}), gap: func() {
		cache.Put(p, req, iam.Decision{Allowed: false})
		if err := local.Bind(ctx, svc.ID, role.ID, "root"); err != nil {
			t.Error(err)
		}
	}}
	done := make(chan error, 1)
	go func() { done <- iamEvents{cache}.follow(ctx, &modules.Runtime{IAM: port}) }()
	select {
	case <-port.following:
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not start following")
	}
	if _, ok := cache.Get(p, req); ok || !port.gapped.Load() {
		t.Fatal("a denial cached while the follower started outlived the binding written meanwhile")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
