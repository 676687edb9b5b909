package capacity_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres/pgtest"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) {
	if url := os.Getenv(leaseChildEnv); url != "" {
		leaseChild(url, os.Getenv(leaseChildPoolEnv)) // a lease holder to be killed (lease_kill_test.go)
		return
	}
	pgtest.Main(m)
}

// t0 is where the tests' clocks stand.
var t0 = time.Date(2030, 3, 4, 10, 0, 0, 0, time.UTC)

// fleetSpec describes a test pool.
type fleetSpec struct {
	nodes, gpus int    // nodes, GPUs per node
	domains     int    // NVLink domains per node (GPUs split evenly); 0: one
	model       string // GPU name as hardware reports it; default an H100
	vcpus, mem  int
	maxConns    int32 // the connection pool's size; 0: computetest's default
	// lease: the control plane runs in the api mode, started, holding the pool's lease (TTL
	// leaseTTL) before the test begins. leaseTTL: the same with this lease time, not started.
	lease    bool
	leaseTTL time.Duration
}

type testFleet struct {
	*computetest.Env
	pool  api.Pool
	nodes []api.Node
	ctx   context.Context
}

func newFleet(t testing.TB, s fleetSpec) *testFleet {
	t.Helper()
	opts := computetest.Options{MaxConns: s.maxConns}
	if s.lease && s.leaseTTL == 0 {
		s.leaseTTL = leaseTTL
	}
	if s.leaseTTL != 0 {
		opts.Mode = compute.ModeAPI
		opts.Configure = func(o *compute.Options) { o.PoolLeaseTTL = s.leaseTTL }
	}
	env := computetest.New(t, opts)
	env.DB.SetNow(t0)
	ctx := context.Background()
	if s.model == "" {
		s.model = "NVIDIA H100 80GB HBM3"
	}
	if s.domains == 0 {
		s.domains = 1
	}
	pool, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	f := &testFleet{Env: env, pool: pool, ctx: ctx}
	for i := range s.nodes {
		f.addNode(t, fmt.Sprintf("node-%03d", i), s)
	}
	if s.lease {
		if err := env.Compute.Start(ctx); err != nil {
			t.Fatal(err)
		}
		awaitLease(t, env.Compute, pool.ID)
	}
	return f
}

// leaseTTL is the lease time of the tests' lease holders. A holder trusts its memory for four
// fifths of it after each renewal: long enough that a loaded machine's pause of a second does not
// send placements to the database, which tests counting placements from memory would see.
const leaseTTL = 3 * time.Second

// leasesOf is c's pool-lease placer.
func leasesOf(c *compute.Compute) *capacity.Leases {
	return c.Runtime().Capacity.(capacity.Service).Leases
}

// awaitLease waits until c holds pool's lease with the pool in memory.
func awaitLease(t testing.TB, c *compute.Compute, pool string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := leasesOf(c).Await(ctx, pool); err != nil {
		t.Fatal(err)
	}
}

func (f *testFleet) addNode(t testing.TB, name string, s fleetSpec) api.Node {
	t.Helper()
	n, err := fleet.InsertNode(f.ctx, f.DB.Pool, fleet.NewNode{PoolID: f.pool.ID, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.DB.Pool.Exec(f.ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, n.ID); err != nil {
		t.Fatal(err)
	}
	inv := capacity.Inventory{VCPUs: s.vcpus, MemoryGiB: s.mem}
	per := s.gpus / s.domains
	for g := range s.gpus {
		inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Name: s.model,
			MemoryMiB: 81559, NVLinkDomain: fmt.Sprintf("%s-nv%d", name, g/max(per, 1))})
	}
	if err := capacity.SetInventory(f.ctx, f.DB.Pool, n.ID, inv); err != nil {
		t.Fatal(err)
	}
	f.nodes = append(f.nodes, n)
	return n
}

func (f *testFleet) reserve(in api.CreateReservation) (api.Reservation, error) {
	if in.Pool == "" {
		in.Pool = "gpu"
	}
	return f.Compute.API.Reservations.Create(f.ctx, f.RootKey, in)
}

func (f *testFleet) mustReserve(t *testing.T, in api.CreateReservation) api.Reservation {
	t.Helper()
	r, err := f.reserve(in)
	if err != nil {
		t.Fatalf("reserve %+v: %v", in, err)
	}
	return r
}

func (f *testFleet) summary(t *testing.T) api.PoolCapacity {
	t.Helper()
	s, err := f.Compute.API.Capacity.Summary(f.ctx, f.RootKey, api.SummarizeCapacity{Pool: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gpuIndexes(a api.Allocation) []int {
	var out []int
	for _, g := range a.GPUs {
		out = append(out, g.Index)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

var (
	checksMu    sync.Mutex // held from setting -rapid.checks until rapid has read it
	checksOnce  sync.Once
	checksGiven bool // -rapid.checks was on the command line
)

// rapidCheck is rapid.Check of prop with n cases (rapid's default when n is 0), unless
// -rapid.checks was given. The count is the process's flag, which rapid reads as a check starts:
// it is set under checksMu, and put back and released at the property's first call, so that
// tests running side by side each get their own count and the others rapid's default. (It was
// once set and left, and every later test ran the first one's.)
func rapidCheck(t *testing.T, n int, prop func(*rapid.T)) {
	t.Helper()
	fl := flag.Lookup("rapid.checks")
	checksOnce.Do(func() { flag.Visit(func(f *flag.Flag) { checksGiven = checksGiven || f == fl }) })
	checksMu.Lock()
	var once sync.Once
	release := func() { // rapid has its count: the flag goes back for whatever runs next
		once.Do(func() {
			if !checksGiven {
				_ = fl.Value.Set(fl.DefValue)
			}
			checksMu.Unlock()
		})
	}
	defer release()
	if !checksGiven {
		v := fl.DefValue
		if n > 0 {
			v = strconv.Itoa(n)
		}
		if err := fl.Value.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	rapid.Check(t, func(rt *rapid.T) {
		release()
		prop(rt)
	})
}
