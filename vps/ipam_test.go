package vps

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
)

// env is a control plane with the vps module, served over real HTTP, and a client of it with
// the root tenant's key.
func env(t testing.TB) (*computetest.Env, *client.Client) {
	t.Helper()
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	cl, err := client.New(e.Server(t), client.WithAPIKey(e.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	return e, cl
}

func mustNetwork(t testing.TB, cl *client.Client, in CreateNetwork) Network {
	t.Helper()
	n, err := client.Call(context.Background(), cl, NetworksCreate, in)
	if err != nil {
		t.Fatalf("create network %s: %v", in.Name, err)
	}
	return n
}

// anInstance writes an instance row of tenant, as instances.create does, for a lease to refer
// to: the flavor and image it needs are made once per tenant.
func anInstance(ctx context.Context, tx pgx.Tx, tenant, id string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO compute.vps_flavors (id, tenant_id, name, vcpus, memory_gib, created_by) VALUES ($1, $2, 'f', 1, 1, 'test')
		ON CONFLICT (tenant_id, name) WHERE deleted_at IS NULL DO NOTHING`, uuid.NewString(), tenant); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO compute.vps_images (id, tenant_id, name, disk_url, disk_sha256, created_by) VALUES ($1, $2, 'i', 'https://images.example.com/d.qcow2', $3, 'test')
		ON CONFLICT (tenant_id, name) WHERE deleted_at IS NULL DO NOTHING`, uuid.NewString(), tenant, fmt.Sprintf("%064x", 1)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO compute.vps_instances (id, tenant_id, name, flavor_id, image_id, reservation_id, node_id, power, created_by)
		SELECT $1, $2, $3, f.id, m.id, $4, $5, 'running', 'test' FROM compute.vps_flavors f, compute.vps_images m
		WHERE f.tenant_id = $2 AND f.name = 'f' AND m.tenant_id = $2 AND m.name = 'i'`, id, tenant, "vm-"+id[len(id)-12:], uuid.NewString(), uuid.NewString())
	return err
}

// allocated creates an instance of tenant with NICs on nics, in one transaction as
// instances.create would, and answers them.
func allocated(ctx context.Context, db *postgres.DB, tenant string, nics ...InstanceNIC) (string, []hostapi.NIC, error) {
	var id string
	var out []hostapi.NIC
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		// Leased first, the row after: the lease's reference to the instance waits for commit.
		id = uuid.Must(uuid.NewV7()).String()
		if out, err = allocate(ctx, tx, tenant, id, nics); err != nil {
			return err
		}
		return anInstance(ctx, tx, tenant, id)
	})
	return id, out, err
}

func release(t testing.TB, db *postgres.DB, id string) int {
	t.Helper()
	var n int
	if err := db.Tx(context.Background(), func(tx pgx.Tx) error {
		var err error
		n, err = releaseAddresses(context.Background(), tx, id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func reason(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		s, _ := e.Details["reason"].(string)
		return s
	}
	return ""
}

func field(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		s, _ := e.Details["field"].(string)
		return s
	}
	return ""
}

func v4(nics []hostapi.NIC) string {
	p, _ := netip.ParsePrefix(nics[0].Addresses[0])
	return p.Addr().String()
}

// TestAllocationNeverGivesAnAddressTwice races goroutines, each creating instances in
// transactions of its own until the network is full, on a /28 with a reserved range: every
// dynamic address is given exactly once, the lowest first, none of the gateway, the reserved
// range, the network or broadcast address; then every racer is told the network is exhausted
// (a conflict, addresses_exhausted). Released addresses are given again, lowest first.
func TestAllocationNeverGivesAnAddressTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cl := env(t)
	n := mustNetwork(t, cl, CreateNetwork{Name: "small", CIDR: "10.9.0.0/28", Reserved: &AddressRange{First: "10.9.0.2", Last: "10.9.0.4"}})
	want := []string{}
	for i := 5; i <= 14; i++ {
		want = append(want, fmt.Sprintf("10.9.0.%d", i))
	}

	race := func(racers int) (got map[string]string, exhausted int) {
		got = map[string]string{} // address → instance
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, racers)
		for range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for {
					id, nics, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "small"})
					if reason(err) == "addresses_exhausted" && api.CodeOf(err) == api.CodeConflict {
						mu.Lock()
						exhausted++
						mu.Unlock()
						return
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					if other, dup := got[v4(nics)]; dup {
						errs <- fmt.Errorf("%s was given to %s and to %s", v4(nics), other, id)
					}
					got[v4(nics)] = id
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return got, exhausted
	}

	got, exhausted := race(12)
	if keys := sortedKeys(got); !slices.Equal(keys, want) || exhausted != 12 {
		t.Fatalf("12 racers were given %v and %d were told the network is full; want each of %v once, and 12 told", keys, exhausted, want)
	}
	if rows := computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.vps_addresses WHERE network_id = $1`, n.ID); rows != 10 {
		t.Fatalf("%d leases recorded, want 10", rows)
	}

	// Three released: five racers get exactly those three, and two hear it is full.
	for _, a := range []string{"10.9.0.6", "10.9.0.9", "10.9.0.12"} {
		if n := release(t, e.DB, got[a]); n != 1 {
			t.Fatalf("releasing %s's instance released %d NICs", a, n)
		}
	}
	again, exhausted := race(5)
	if keys := sortedKeys(again); !slices.Equal(keys, []string{"10.9.0.6", "10.9.0.9", "10.9.0.12"}) || exhausted != 5 {
		t.Fatalf("after releasing three, racers were given %v (%d told it is full)", keys, exhausted)
	}

	// Lowest first: of .5 and .14 released, .5 is given, then .14.
	release(t, e.DB, got["10.9.0.14"])
	release(t, e.DB, got["10.9.0.5"])
	for _, w := range []string{"10.9.0.5", "10.9.0.14"} {
		_, nics, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: n.ID})
		if err != nil || v4(nics) != w {
			t.Fatalf("allocated %v, %v; want %s, the lowest free", nics, err, w)
		}
	}
	_, _, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "small"})
	if reason(err) != "addresses_exhausted" {
		t.Fatalf("a full network answered %v", err)
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return netip.MustParseAddr(out[i]).Less(netip.MustParseAddr(out[j])) })
	return out
}

// TestStaticAddresses: a static address, in the reserved range or not, is honoured once; asked
// again (even by racers at once) it is a conflict naming the field; the network's own,
// broadcast and gateway addresses, one outside its range and an IPv6 one of a network without
// IPv6 are refused as bad input, naming the field. A tenant cannot lease on another's network.
func TestStaticAddresses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cl := env(t)
	mustNetwork(t, cl, CreateNetwork{Name: "lan", CIDR: "10.9.0.0/24", Reserved: &AddressRange{First: "10.9.0.2", Last: "10.9.0.9"}})
	_, nics, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan", Address: "10.9.0.3"})
	if err != nil || v4(nics) != "10.9.0.3" {
		t.Fatalf("static 10.9.0.3 in the reserved range: %v, %v", nics, err)
	}
	_, nics, err = allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan"})
	if err != nil || v4(nics) != "10.9.0.10" {
		t.Fatalf("a dynamic address = %v, %v; want 10.9.0.10, the first after the reserved range", nics, err)
	}
	_, _, err = allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan", Address: "10.9.0.10"})
	if api.CodeOf(err) != api.CodeConflict || reason(err) != "address_taken" || field(err) != "networks[0].address" {
		t.Fatalf("a static address given dynamically before = %v, want a conflict (address_taken) naming networks[0].address", err)
	}

	// Racers for one static address: one wins.
	var wg sync.WaitGroup
	results := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan", Address: "10.9.0.200"})
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	won, taken := 0, 0
	for err := range results {
		switch {
		case err == nil:
			won++
		case reason(err) == "address_taken":
			taken++
		default:
			t.Errorf("a racer for 10.9.0.200: %v", err)
		}
	}
	if won != 1 || taken != 7 {
		t.Fatalf("8 racers for one static address: %d won, %d told it is taken", won, taken)
	}

	for _, c := range []struct {
		nic   InstanceNIC
		field string
	}{
		{InstanceNIC{Network: "lan", Address: "10.9.0.0"}, "networks[0].address"},
		{InstanceNIC{Network: "lan", Address: "10.9.0.255"}, "networks[0].address"},
		{InstanceNIC{Network: "lan", Address: "10.9.0.1"}, "networks[0].address"},
		{InstanceNIC{Network: "lan", Address: "10.10.0.5"}, "networks[0].address"},
		{InstanceNIC{Network: "lan", Address: "fe80::1"}, "networks[0].address"},
		{InstanceNIC{Network: "lan", Address6: "2001:db8::5"}, "networks[0].address6"},
		{InstanceNIC{Network: ""}, "networks[0].network"},
	} {
		_, _, err := allocated(ctx, e.DB, computetest.RootTenantID, c.nic)
		if api.CodeOf(err) != api.CodeInvalidArgument || field(err) != c.field {
			t.Errorf("%+v = %v, want invalid_argument naming %s", c.nic, err, c.field)
		}
	}
	_, _, err = allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan"}, InstanceNIC{Network: "lan"})
	if api.CodeOf(err) != api.CodeInvalidArgument || field(err) != "networks[1].network" {
		t.Errorf("one network twice = %v", err)
	}
	acme, _ := e.Tenant(t, "acme")
	if _, _, err := allocated(ctx, e.DB, acme, InstanceNIC{Network: "lan"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("another tenant's network = %v, want not_found", err)
	}
}

// TestNICsOfAnInstance: an instance's NICs come back in order with what its host needs — a
// fixed, locally administered MAC, the bridge and VLAN, addresses with the prefix length (an
// IPv6 one too on a dual-stack network), gateways and resolvers — the same from allocate and
// from what the desired state reads; released, they are all gone. An IPv6 range runs out on
// its own.
func TestNICsOfAnInstance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cl := env(t)
	mustNetwork(t, cl, CreateNetwork{Name: "lan", CIDR: "10.20.0.0/24", DNS: []string{"10.20.0.1"}})
	dual := mustNetwork(t, cl, CreateNetwork{Name: "dual", CIDR: "10.30.0.0/28", CIDR6: "2001:db8:30::/126", VLAN: 30, DNS: []string{"2606:4700:4700::1111"}})
	id, nics, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "dual"}, InstanceNIC{Network: "lan"})
	if err != nil {
		t.Fatal(err)
	}
	want := []hostapi.NIC{
		{Network: dual.ID, MAC: nicMAC(id, 0), Bridge: "br30", VLAN: 30, Addresses: []string{"10.30.0.2/28", "2001:db8:30::2/126"},
			Gateway: "10.30.0.1", Gateway6: "2001:db8:30::1", DNS: []string{"2606:4700:4700::1111"}},
		{Network: nics[1].Network, MAC: nicMAC(id, 1), Bridge: "br0", Addresses: []string{"10.20.0.2/24"}, Gateway: "10.20.0.1", DNS: []string{"10.20.0.1"}},
	}
	if d := cmp.Diff(want, nics); d != "" {
		t.Fatalf("allocate answered (-want +got):\n%s", d)
	}
	read, err := instanceNICs(ctx, e.DB.Pool, []string{id, uuid.NewString()})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string][]hostapi.NIC{id: want}, read); d != "" {
		t.Fatalf("instanceNICs read (-want +got):\n%s", d)
	}
	for i, n := range nics {
		mac, err := net.ParseMAC(n.MAC)
		if err != nil || len(mac) != 6 || mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
			t.Errorf("NIC %d's MAC %s is not a locally administered unicast address", i, n.MAC)
		}
	}
	if again := nicMAC(id, 0); nics[0].MAC == nics[1].MAC || again != nics[0].MAC || again == nicMAC(uuid.NewString(), 0) {
		t.Error("MACs are not fixed by instance and index, or not distinct")
	}

	// The /126 has ::2 and ::3 for instances (::0 is the subnet's, ::1 the gateway): the
	// third dual-stack instance finds IPv6 exhausted though IPv4 has room.
	_, second, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "dual"})
	if err != nil || second[0].Addresses[1] != "2001:db8:30::3/126" {
		t.Fatalf("second dual-stack NIC: %v, %v", second, err)
	}
	_, _, err = allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "dual"})
	if reason(err) != "addresses_exhausted" {
		t.Fatalf("IPv6 exhausted: %v", err)
	}
	_, static, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "lan", Address: "10.20.0.77"})
	if err != nil || static[0].Addresses[0] != "10.20.0.77/24" {
		t.Fatalf("static on lan: %v, %v", static, err)
	}

	if n := release(t, e.DB, id); n != 2 {
		t.Fatalf("released %d NICs, want 2", n)
	}
	if read, err := instanceNICs(ctx, e.DB.Pool, []string{id}); err != nil || len(read) != 0 {
		t.Fatalf("after release: %v, %v", read, err)
	}
	if n := release(t, e.DB, id); n != 0 {
		t.Fatalf("releasing twice released %d", n)
	}
}

// BenchmarkLowestFree picks an address in a /16 holding 20,000 leases: "sparse" has its gap
// at the first address (the walk reads nothing), "packed" after all of them (the walk reads
// every lease, through the index, in the database).
func BenchmarkLowestFree(b *testing.B) {
	ctx := context.Background()
	e, cl := env(b)
	n := mustNetwork(b, cl, CreateNetwork{Name: "big", CIDR: "10.8.0.0/16"})
	one := uuid.NewString()
	if err := e.DB.Tx(ctx, func(tx pgx.Tx) error { return anInstance(ctx, tx, computetest.RootTenantID, one) }); err != nil {
		b.Fatal(err)
	}
	const leases = 20000
	if _, err := e.DB.Pool.Exec(ctx, `INSERT INTO compute.vps_instances (id, tenant_id, name, flavor_id, image_id, reservation_id, node_id, power, created_by)
		SELECT gen_random_uuid(), tenant_id, 'b' || g, flavor_id, image_id, reservation_id, node_id, power, created_by
		FROM compute.vps_instances, generate_series(1, $2) g WHERE id = $1`, one, leases); err != nil {
		b.Fatal(err)
	}
	if _, err := e.DB.Pool.Exec(ctx, `INSERT INTO compute.vps_addresses (network_id, instance_id, nic, mac, address)
		SELECT $1, id, 0, '02:00:00:00:00:00', '10.8.0.2'::inet + row_number() OVER (ORDER BY id) FROM compute.vps_instances WHERE name LIKE 'b%'`, n.ID); err != nil {
		b.Fatal(err)
	}
	if _, err := e.DB.Pool.Exec(ctx, `ANALYZE compute.vps_addresses`); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, want string }{{"sparse", "10.8.0.2"}, {"packed", "10.8.78.35"}} {
		if c.name == "packed" {
			if _, err := e.DB.Pool.Exec(ctx, `INSERT INTO compute.vps_addresses (network_id, instance_id, nic, mac, address) VALUES ($1, $2, 0, '02:00:00:00:00:01', '10.8.0.2')`, n.ID, one); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				a, err := lowestFree(ctx, e.DB.Pool, n, false)
				if err != nil || a.String() != c.want {
					b.Fatalf("picked %s, %v; want %s", a, err, c.want)
				}
			}
		})
	}
}
