package vps

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
)

// TestNetworksOverTheAPI creates, reads, lists and deletes networks over real HTTP: defaults are
// filled (gateway, bridge), each mutation makes one IAM decision and one event, overlapping
// ranges of a tenant, two VLANs on one bridge and overlapping ranges of one segment (any
// tenants') are refused by the database's EXCLUDE constraints as conflicts, another tenant's
// ranges are its own, and a network with leases stays.
func TestNetworksOverTheAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cl := env(t)

	e.Counter.Reset()
	lan := mustNetwork(t, cl, CreateNetwork{Name: "lan", CIDR: "10.20.0.0/24", DNS: []string{"1.1.1.1", "2606:4700:4700::1111"}})
	if ds := e.Counter.Decisions(); len(ds) != 1 || ds[0].Action != "compute:networks:create" {
		t.Fatalf("networks.create made the decisions %+v, want one of compute:networks:create", ds)
	}
	if lan.Gateway != "10.20.0.1" || lan.Bridge != "br0" || lan.VLAN != 0 || len(lan.DNS) != 2 || lan.CIDR6 != "" || lan.Reserved != nil {
		t.Fatalf("lan = %+v: want the first address as gateway, br0, untagged", lan)
	}
	v100 := mustNetwork(t, cl, CreateNetwork{Name: "v100", CIDR: "10.30.0.0/24", CIDR6: "2001:db8:30::/64", VLAN: 100,
		Reserved: &AddressRange{First: "10.30.0.2", Last: "10.30.0.20"}})
	if v100.Bridge != "br100" || v100.Gateway6 != "2001:db8:30::1" || v100.Reserved == nil || v100.Reserved.Last != "10.30.0.20" || v100.DNS == nil {
		t.Fatalf("v100 = %+v", v100)
	}
	got, err := client.Call(ctx, cl, NetworksGet, NetworkRef{Network: "v100"})
	if err != nil || got.ID != v100.ID || got.CIDR6 != "2001:db8:30::/64" || got.VLAN != 100 {
		t.Fatalf("get v100 = %+v, %v", got, err)
	}
	page, err := client.Call(ctx, cl, NetworksList, ListNetworks{PageRequest: api.PageRequest{Limit: 1}})
	if err != nil || len(page.Items) != 1 || page.Items[0].Name != "lan" || page.NextCursor == "" {
		t.Fatalf("list = %+v, %v", page, err)
	}
	page, err = client.Call(ctx, cl, NetworksList, ListNetworks{PageRequest: api.PageRequest{Limit: 1, Cursor: page.NextCursor}})
	if err != nil || len(page.Items) != 1 || page.Items[0].Name != "v100" {
		t.Fatalf("list's second page = %+v, %v", page, err)
	}

	acme, acmeKey := e.Tenant(t, "acme")
	acl, err := client.New(e.Server(t), client.WithAPIKey(acmeKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		as     *client.Client
		in     CreateNetwork
		reason string
	}{
		{cl, CreateNetwork{Name: "lan", CIDR: "10.99.0.0/24", Bridge: "br99"}, "name_taken"},
		{cl, CreateNetwork{Name: "half", CIDR: "10.20.0.128/25", Bridge: "br9"}, "overlap"},
		{cl, CreateNetwork{Name: "wide", CIDR: "10.0.0.0/8", Bridge: "br9"}, "overlap"},
		{cl, CreateNetwork{Name: "six", CIDR: "10.40.0.0/24", CIDR6: "2001:db8:30::/48", Bridge: "br9"}, "overlap"},
		{cl, CreateNetwork{Name: "other", CIDR: "10.50.0.0/24", Bridge: "br100", VLAN: 200}, "bridge_vlan"},
		{cl, CreateNetwork{Name: "untag", CIDR: "10.50.0.0/24", Bridge: "br100"}, "bridge_vlan"},
		{acl, CreateNetwork{Name: "theirs", CIDR: "10.30.0.0/25", VLAN: 100}, "segment_overlap"},
	} {
		_, err := client.Call(ctx, c.as, NetworksCreate, c.in)
		if api.CodeOf(err) != api.CodeConflict || reason(err) != c.reason {
			t.Errorf("create %+v = %v, want a conflict (%s)", c.in, err, c.reason)
		}
		if c.as == acl && strings.Contains(err.Error(), "v100") {
			t.Errorf("a conflict told acme of root's network: %v", err)
		}
	}
	// acme's own ranges are its own, on another segment.
	theirs, err := client.Call(ctx, acl, NetworksCreate, CreateNetwork{Name: "lan", CIDR: "10.20.0.0/24", Bridge: "acme0"})
	if err != nil || theirs.TenantID != acme {
		t.Fatalf("acme's lan = %+v, %v", theirs, err)
	}
	if _, err := client.Call(ctx, acl, NetworksGet, NetworkRef{Network: v100.ID}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("acme read root's network: %v", err)
	}

	// A lease keeps the network; released, it goes (one decision, one event).
	id, nics, err := allocated(ctx, e.DB, computetest.RootTenantID, InstanceNIC{Network: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := client.Call(ctx, cl, NetworksAddresses, ListAddresses{Network: "v100"})
	if err != nil || len(addrs.Items) != 1 || addrs.Items[0].InstanceID != id || addrs.Items[0].Address != "10.30.0.21" ||
		addrs.Items[0].Address6 != "2001:db8:30::2" || addrs.Items[0].MAC != nics[0].MAC {
		t.Fatalf("v100's addresses = %+v, %v; want the instance's lease of 10.30.0.21, the first after the reserved range", addrs, err)
	}
	if _, err := client.Call(ctx, cl, NetworksDelete, NetworkRef{Network: "v100"}); api.CodeOf(err) != api.CodeFailedPrecondition || reason(err) != "in_use" {
		t.Fatalf("deleting a network with a lease = %v, want failed_precondition (in_use)", err)
	}
	release(t, e.DB, id)
	e.Counter.Reset()
	if _, err := client.Call(ctx, cl, NetworksDelete, NetworkRef{Network: "v100"}); err != nil {
		t.Fatal(err)
	}
	if ds := e.Counter.Decisions(); len(ds) != 1 || ds[0].Action != "compute:networks:delete" || ds[0].Resource.ID != v100.ID {
		t.Fatalf("networks.delete made the decisions %+v", ds)
	}
	if _, err := client.Call(ctx, cl, NetworksGet, NetworkRef{Network: "v100"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("a deleted network = %v", err)
	}
	var created, deleted int
	if err := e.DB.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE type = 'network.created'), count(*) FILTER (WHERE type = 'network.deleted')
		FROM compute.events`).Scan(&created, &deleted); err != nil || created != 3 || deleted != 1 {
		t.Fatalf("events: %d network.created, %d network.deleted (%v); want 3 and 1", created, deleted, err)
	}
	// Its range is free again for the tenant.
	mustNetwork(t, cl, CreateNetwork{Name: "v100b", CIDR: "10.30.0.0/24", VLAN: 100})
}

// TestBadNetworksAreRefusedNamingTheField: each mistake is invalid_argument naming its field,
// over the API, and nothing is written.
func TestBadNetworksAreRefusedNamingTheField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, cl := env(t)
	ok := CreateNetwork{Name: "n", CIDR: "10.20.0.0/24"}
	with := func(f func(*CreateNetwork)) CreateNetwork { c := ok; f(&c); return c }
	for _, c := range []struct {
		in    CreateNetwork
		field string
		says  string
	}{
		{with(func(c *CreateNetwork) { c.Name = "No" }), "name", "not a valid name"},
		{with(func(c *CreateNetwork) { c.CIDR = "" }), "cidr", "is required"},
		{with(func(c *CreateNetwork) { c.CIDR = "10.20.0.0" }), "cidr", "not a CIDR range"},
		{with(func(c *CreateNetwork) { c.CIDR = "10.20.0.5/24" }), "cidr", "host bits set: the range is 10.20.0.0/24"},
		{with(func(c *CreateNetwork) { c.CIDR = "10.20.0.0/31" }), "cidr", "/31 is out of range"},
		{with(func(c *CreateNetwork) { c.CIDR = "10.0.0.0/7" }), "cidr", "/7 is out of range"},
		{with(func(c *CreateNetwork) { c.CIDR = "2001:db8::/64" }), "cidr", "is not an IPv4 range"},
		{with(func(c *CreateNetwork) { c.Gateway = "10.21.0.1" }), "gateway", "outside the network's range 10.20.0.0/24"},
		{with(func(c *CreateNetwork) { c.Gateway = "10.20.0.0" }), "gateway", "the range's own address"},
		{with(func(c *CreateNetwork) { c.Gateway = "10.20.0.255" }), "gateway", "broadcast address"},
		{with(func(c *CreateNetwork) { c.Gateway = "gw" }), "gateway", "not an IPv4 address"},
		{with(func(c *CreateNetwork) { c.Gateway6 = "2001:db8::1" }), "gateway6", "goes with cidr6"},
		{with(func(c *CreateNetwork) { c.CIDR6 = "10.30.0.0/24" }), "cidr6", "not an IPv6 range"},
		{with(func(c *CreateNetwork) { c.CIDR6 = "2001:db8::/32" }), "cidr6", "/32 is out of range"},
		{with(func(c *CreateNetwork) { c.CIDR6, c.Gateway6 = "2001:db8::/64", "2001:db9::1" }), "gateway6", "outside"},
		{with(func(c *CreateNetwork) { c.CIDR6, c.Gateway6 = "2001:db8::/64", "2001:db8::" }), "gateway6", "own address"},
		{with(func(c *CreateNetwork) { c.DNS = []string{"1.1.1.1", "dns.example.com"} }), "dns[1]", "not an IP address"},
		{with(func(c *CreateNetwork) { c.DNS = make([]string, 9) }), "dns", "limit is 8"},
		{with(func(c *CreateNetwork) { c.VLAN = 4095 }), "vlan", "4095 is out of range"},
		{with(func(c *CreateNetwork) { c.VLAN = -1 }), "vlan", "-1 is out of range"},
		{with(func(c *CreateNetwork) { c.Bridge = "bridge-name-too-long" }), "bridge", "not a Linux interface name"},
		{with(func(c *CreateNetwork) { c.Bridge = "br 0" }), "bridge", "not a Linux interface name"},
		{with(func(c *CreateNetwork) { c.Reserved = &AddressRange{First: "10.20.0.9", Last: "10.20.0.2"} }), "reserved", "ends (10.20.0.2) before it starts"},
		{with(func(c *CreateNetwork) { c.Reserved = &AddressRange{First: "10.20.0.2"} }), "reserved.last", "is required"},
		{with(func(c *CreateNetwork) { c.Reserved = &AddressRange{First: "10.20.0.2", Last: "10.20.1.2"} }), "reserved.last", "outside"},
	} {
		_, err := client.Call(ctx, cl, NetworksCreate, c.in)
		if api.CodeOf(err) != api.CodeInvalidArgument || field(err) != c.field || !strings.Contains(err.Error(), c.says) {
			t.Errorf("create %+v = %v; want invalid_argument naming %s, saying %q", c.in, err, c.field, c.says)
		}
	}
	if n := computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.vps_networks`); n != 0 {
		t.Fatalf("%d networks written", n)
	}
	for _, in := range []ListAddresses{{}, {Network: "n", PageRequest: api.PageRequest{Limit: -1}}, {Network: "n", PageRequest: api.PageRequest{Cursor: "nonsense"}}} {
		if _, err := client.Call(ctx, cl, NetworksAddresses, in); api.CodeOf(err) != api.CodeInvalidArgument && api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("addresses %+v = %v", in, err)
		}
	}
}

// network is a generated networks.create input: mostly near-valid, so that every rule is met and
// broken.
func network(t *rapid.T) CreateNetwork {
	bits := rapid.OneOf(rapid.SampledFrom([]int{7, 8, 29, 30, 31, 32}), rapid.IntRange(0, 32)).Draw(t, "bits") // the edges, often
	base := netip.AddrFrom4([4]byte{10, byte(rapid.IntRange(0, 255).Draw(t, "b1")), byte(rapid.IntRange(0, 255).Draw(t, "b2")), byte(rapid.IntRange(0, 255).Draw(t, "b3"))})
	p := netip.PrefixFrom(base, bits)
	if rapid.IntRange(0, 4).Draw(t, "hostBits") > 0 {
		p = p.Masked()
	}
	in := CreateNetwork{Name: "n", CIDR: p.String()}
	size := uint32(1) << (32 - bits)
	at := func(off uint32) string {
		b := p.Masked().Addr().As4()
		v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	}
	gw := rapid.SampledFrom([]string{"", "", "", "inside", "inside", "network", "broadcast", "outside", "junk", "v6"}).Draw(t, "gateway")
	switch gw {
	case "inside":
		in.Gateway = at(uint32(rapid.Uint32Range(0, size-1).Draw(t, "gwOffset")))
	case "network":
		in.Gateway = at(0)
	case "broadcast":
		in.Gateway = at(size - 1)
	case "outside":
		in.Gateway = "192.168.0.1"
	case "junk":
		in.Gateway = "10.0.0.256"
	case "v6":
		in.Gateway = "::ffff:10.0.0.1"
	}
	in.VLAN = rapid.OneOf(rapid.SampledFrom([]int{-1, 0, 1, 4094, 4095}), rapid.IntRange(0, 4094)).Draw(t, "vlan")
	in.Bridge = rapid.SampledFrom([]string{"", "", "br-x", "br.7_a", "x", "toolong-bridge-1", "-br", "br/0"}).Draw(t, "bridge")
	return in
}

// expectValid is the rules, said another way: a range of /8 to /30 with no host bits, a
// gateway (if given) that is a host address of it, a VLAN of 0 to 4094, a bridge (if given) of
// 1 to 15 characters of [A-Za-z0-9_.-], not starting with - . or _.
func expectValid(in CreateNetwork) bool {
	p, err := netip.ParsePrefix(in.CIDR)
	if err != nil || p.Bits() < 8 || p.Bits() > 30 || p.Masked() != p {
		return false
	}
	if in.Gateway != "" {
		g, err := netip.ParseAddr(in.Gateway)
		if err != nil || !g.Is4() || !p.Contains(g) || g == p.Addr() || g == lastAddr(p) {
			return false
		}
	}
	if in.VLAN < 0 || in.VLAN > 4094 {
		return false
	}
	switch in.Bridge {
	case "", "br-x", "br.7_a", "x":
		return true
	}
	return false
}

// TestNetworkValidationProperties checks networks.create's input check against the rules said
// another way (expectValid), over many generated inputs, and against the database: what it
// accepts, the table's CHECK and type constraints accept too, with the gateway it filled; what
// it refuses for its range or gateway, the table refuses too.
func TestNetworkValidationProperties(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for range 10 { // 1,000 inputs: the edges (a /31 with the default gateway, say) are rare
		rapid.Check(t, func(rt *rapid.T) {
			in := network(rt)
			err := in.Validate()
			if want := expectValid(in); (err == nil) != want {
				rt.Fatalf("Validate(%+v) = %v, want valid %v", in, err, want)
			}
			if err != nil && (api.CodeOf(err) != api.CodeInvalidArgument || field(err) == "") {
				rt.Fatalf("Validate(%+v) = %v: want invalid_argument naming the field", in, err)
			}
			s, err := in.spec()
			if err == nil && (!s.cidr.Contains(s.gateway) || s.gateway == s.cidr.Addr() || s.gateway == lastAddr(s.cidr) || s.bridge == "") {
				rt.Fatalf("%+v was accepted as %+v", in, s)
			}
		})
	}

	e, _ := env(t)
	rapid.Check(t, func(rt *rapid.T) {
		in := network(rt)
		_, specErr := in.spec()
		gw := in.Gateway // its default filled as the Go side fills it
		if p, err := netip.ParsePrefix(in.CIDR); err == nil && gw == "" {
			gw = p.Masked().Addr().Next().String()
		}
		dbErr := e.DB.Tx(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO compute.vps_networks (id, tenant_id, name, cidr, gateway, bridge, vlan, created_by)
				VALUES ($1, 'prop', 'n', $2::text::cidr, $3::text::inet, 'br0', NULL, 'test')`, uuid.NewString(), in.CIDR, gw)
			if err == nil {
				return errRollback
			}
			return err
		})
		dbAccepts := errors.Is(dbErr, errRollback)
		if (specErr == nil || field(specErr) == "cidr" || field(specErr) == "gateway") && dbAccepts != (specErr == nil) {
			rt.Fatalf("cidr %s, gateway %q: Go says %v, the table says %v", in.CIDR, gw, specErr, dbErr)
		}
	})
}

var errRollback = errors.New("rolled back on purpose")

// FuzzCreateNetwork: whatever the input, the check answers (never panics), and either accepts
// a network whose gateway is a host address of its range, with a VLAN in range and a bridge
// name, or refuses it as invalid_argument naming a field.
func FuzzCreateNetwork(f *testing.F) {
	for _, s := range [][5]string{
		{"10.20.0.0/24", "", "", "", ""}, {"10.20.0.0/24", "10.20.0.254", "2001:db8::/64", "fe80::1", "br0"},
		{"10.20.0.5/24", "", "", "", ""}, {"0.0.0.0/0", "0.0.0.0", "::/0", "::", ""}, {"10.0.0.0/30", "10.0.0.2", "2001:db8::/126", "2001:db8::3", "x"},
		{"::ffff:10.0.0.0/120", "", "", "", ""}, {"10.20.0.0/24", "10.20.0.1%eth0", "", "", "br 0"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], 100)
	}
	f.Fuzz(func(t *testing.T, cidr, gw, cidr6, gw6, bridge string, vlan int) {
		in := CreateNetwork{Name: "n", CIDR: cidr, Gateway: gw, CIDR6: cidr6, Gateway6: gw6, Bridge: bridge, VLAN: vlan}
		s, err := in.spec()
		if err != nil {
			if api.CodeOf(err) != api.CodeInvalidArgument || field(err) == "" {
				t.Fatalf("%+v: %v is not invalid_argument naming a field", in, err)
			}
			return
		}
		if !s.cidr.Addr().Is4() || s.cidr.Masked() != s.cidr || !s.cidr.Contains(s.gateway) || s.gateway == s.cidr.Addr() || s.gateway == lastAddr(s.cidr) {
			t.Fatalf("%+v accepted with range %s and gateway %s", in, s.cidr, s.gateway)
		}
		if s.cidr6.IsValid() && (!s.cidr6.Addr().Is6() || s.cidr6.Masked() != s.cidr6 || (!s.cidr6.Contains(s.gateway6) && !s.gateway6.IsLinkLocalUnicast())) {
			t.Fatalf("%+v accepted with IPv6 range %s and gateway %s", in, s.cidr6, s.gateway6)
		}
		if s.vlan < 0 || s.vlan > 4094 || !bridgeRE.MatchString(s.bridge) {
			t.Fatalf("%+v accepted with VLAN %d, bridge %q", in, s.vlan, s.bridge)
		}
		// A fresh host address of the range is a valid static request, and the gateway is not.
		if _, err := staticIn("address", s.gateway.String(), s.cidr, s.gateway); err == nil {
			t.Fatalf("the gateway %s was accepted as a static address", s.gateway)
		}
	})
}
