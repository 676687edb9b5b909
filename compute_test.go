package compute_test

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestAPIMatchesMethodTable checks that compute.API has exactly one call per core method, named
// after it, with the table's input and output types.
func TestAPIMatchesMethodTable(t *testing.T) {
	t.Parallel()
	want := map[string]bool{}
	for _, m := range api.Methods() {
		want[title(m.Group)+"."+title(m.Name)] = true
		if m.Mutating {
			want[title(m.Group)+"."+title(m.Name)+"Tx"] = true // its twin in the host's transaction
		}
	}
	got := map[string]bool{}
	at := reflect.TypeOf(compute.API{})
	for i := range at.NumField() {
		g := at.Field(i)
		for j := range g.Type.NumMethod() {
			got[g.Name+"."+g.Type.Method(j).Name] = true
		}
	}
	var missing, extra []string
	for k := range want {
		if !got[k] {
			missing = append(missing, k)
		}
	}
	for k := range got {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing)+len(extra) > 0 {
		t.Fatalf("compute.API drifted from api.Methods: missing %v, extra %v", missing, extra)
	}
}

// title is a method's Go name: its first letter upper case, a leading initialism all upper case
// (sshCA is SSHCA), as Go spells them.
func title(s string) string {
	for _, w := range []string{"ssh", "gpu", "mig", "cdi", "bmc", "api", "id", "ip"} {
		if strings.HasPrefix(s, w) && (len(s) == len(w) || unicode.IsUpper(rune(s[len(w)]))) {
			return strings.ToUpper(w) + s[len(w):]
		}
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// TestInitializeConcurrently starts several control planes on one fresh database at once, as
// several processes would; each must initialize, and the schema must be applied once.
func TestInitializeConcurrently(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t) // an empty database
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := pgtest.Open(t, url) // a pool of its own, as another process has
			port, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"})
			if err != nil {
				errs[i] = err
				return
			}
			c, err := compute.New(compute.Options{Database: db, Secret: strings.Repeat("k", 40), BaseURL: "http://x.test",
				RootTenantID: "root", IAM: port})
			if err == nil {
				err = c.Initialize(context.Background())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("control plane %d: %v", i, err)
		}
	}
}

func TestWorkerPrunesIdempotencyKeys(t *testing.T) {
	t.Parallel()
	env := newEnvMode(t, compute.ModeWorker)
	ctx := context.Background()
	if _, err := env.Compute.API.Pools.Create(api.WithIdempotencyKey(ctx, "old"), env.RootKey, api.CreatePool{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.idempotency_keys"); n != 1 {
		t.Fatalf("%d idempotency keys stored, want 1", n)
	}
	env.DB.SetNow(time.Now().Add(envelope.DefaultIdempotencyTTL + time.Hour))
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 10*time.Second, "the worker pruning an expired idempotency key", func() bool {
		return computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.idempotency_keys") == 0
	})
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := env.Compute.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
}

// TestModeDecidesWorkers checks that an api process does not run the worker's background work.
func TestModeDecidesWorkers(t *testing.T) {
	t.Parallel()
	env := newEnvMode(t, compute.ModeAPI)
	ctx := context.Background()
	if _, err := env.Compute.API.Pools.Create(api.WithIdempotencyKey(ctx, "old"), env.RootKey, api.CreatePool{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	env.DB.SetNow(time.Now().Add(envelope.DefaultIdempotencyTTL + time.Hour))
	url := env.Server(t)
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Start launches every worker of the mode at once, and each runs its first round at once: a
	// round of the api mode's pool-lease worker shows they have, and Stop waits for them all.
	computetest.Eventually(t, 30*time.Second, "a round of the api mode's pool-lease worker", func() bool {
		return value(scrape(t, url), "better_compute_worker_tick_seconds", map[string]string{"worker": "pool-lease"}) >= 1
	})
	if err := env.Compute.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := computetest.Count(t, env.DB.Pool, "SELECT count(*) FROM compute.idempotency_keys"); n != 1 {
		t.Fatalf("an api-mode process pruned idempotency keys (%d left); pruning is the worker's", n)
	}
	if n := value(scrape(t, url), "better_compute_worker_tick_seconds", map[string]string{"worker": "idempotency-prune"}); n != -1 {
		t.Fatalf("an api-mode process ran %v rounds of the idempotency-prune worker", n)
	}
}
