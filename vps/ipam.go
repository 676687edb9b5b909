package vps

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
)

// IPAM: the address leases of instances' NICs (compute.vps_addresses). The allocator picks the
// lowest free address of a network by walking its leases in address order to the first gap, and
// the lease table's EXCLUDE constraints referee: of two creates that picked the same address
// concurrently, the second's insert waits for the first to commit and then inserts nothing, and
// it picks again, now seeing the winner's lease.
//
// The instance side calls these inside its create and delete transactions (instances.go):
//
//	nics, err := allocate(ctx, c.Tx, c.Target.TenantID, id, in.Networks) // in createInstance
//	_, err := releaseAddresses(ctx, tx, i.ID)                            // in deleteInstance
//	nics, err := instanceNICs(ctx, q, ids)                               // in desiredInstances
//
// allocate may run before the instance's row is written: the lease's reference to it is
// checked at commit.

// MaxNICs is how many NICs an instance may have.
const MaxNICs = 8

// allocateAttempts bounds the picks of one NIC that lose races before the call is retried whole.
const allocateAttempts = 32

// InstanceNIC asks for one NIC of an instance on a network. An instance's NICs are in the
// order given: the first is the guest's eth0, and has its default route.
type InstanceNIC struct {
	Network string `json:"network"` // id or name of a network of the instance's tenant
	// Address asks for a static IPv4 address of the network (it may be in its reserved range);
	// default: the lowest free address outside the reserved range.
	Address string `json:"address,omitempty"`
	// Address6 asks for a static IPv6 address, on a network with cidr6; default: the lowest
	// free one.
	Address6 string `json:"address6,omitempty"`
}

// ValidateNICs checks an instance's NIC requests (for the input check of instances.create),
// naming the field (e.g. networks[1].address) of what is wrong.
func ValidateNICs(field string, nics []InstanceNIC) error {
	if len(nics) > MaxNICs {
		return api.InvalidField(field, "has %d NICs; the limit is %d", len(nics), MaxNICs)
	}
	seen := map[string]bool{}
	for i, n := range nics {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := api.ValidateRef(f+".network", n.Network); err != nil {
			return err
		}
		if seen[n.Network] {
			return api.InvalidField(f+".network", "network %s is named twice: an instance has one NIC per network", n.Network)
		}
		seen[n.Network] = true
		if a, err := netip.ParseAddr(n.Address); n.Address != "" && (err != nil || !a.Is4()) {
			return api.InvalidField(f+".address", "%q is not an IPv4 address", n.Address)
		}
		if a, err := netip.ParseAddr(n.Address6); n.Address6 != "" && (err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "") {
			return api.InvalidField(f+".address6", "%q is not an IPv6 address", n.Address6)
		}
	}
	return nil
}

// nicMAC is the MAC address of an instance's NIC: fixed by the instance's id and the NIC's
// index, so that the guest keeps it across restarts and hosts, locally administered and
// unicast (02:… bits), the other 46 bits from a hash. Two NICs of one segment collide with a
// chance of about n²/2⁴⁷ (10,000 NICs: 1 in 1.4 million).
func nicMAC(instanceID string, nic int) string {
	h := sha256.Sum256([]byte("better-compute/vps/nic\x00" + instanceID + "\x00" + strconv.Itoa(nic)))
	h[0] = h[0]&0xfc | 0x02 // locally administered, unicast
	return net.HardwareAddr(h[:6]).String()
}

// allocate leases the addresses of an instance's NICs on the tenant's networks, in the
// caller's transaction, and returns what its host needs of each NIC. A network of another
// tenant reads as not found; a static address that is taken is a conflict (address_taken); a
// network with no free address is a conflict (addresses_exhausted).
func allocate(ctx context.Context, tx pgx.Tx, tenant, instanceID string, nics []InstanceNIC) ([]hostapi.NIC, error) {
	if err := ValidateNICs("networks", nics); err != nil {
		return nil, err
	}
	var leased bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.vps_addresses WHERE instance_id = $1)`, instanceID).Scan(&leased); err != nil {
		return nil, err
	}
	if leased {
		return nil, fmt.Errorf("vps: instance %s already has addresses: allocate once per instance", instanceID)
	}
	nets := make([]Network, len(nics))
	for i, n := range nics {
		var err error
		if nets[i], err = networkOf(ctx, tx, tenant, n.Network); err != nil {
			return nil, err
		}
	}
	// Lease in network order, whatever the NICs' order: two creates that share networks then
	// wait on each other in one order, never in a cycle.
	order := make([]int, len(nics))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(nets[a].ID, nets[b].ID) })
	out := make([]hostapi.NIC, len(nics))
	for _, i := range order {
		a4, a6, err := lease(ctx, tx, nets[i], instanceID, i, nics[i], fmt.Sprintf("networks[%d]", i))
		if err != nil {
			return nil, err
		}
		out[i] = hostNIC(nets[i], nicMAC(instanceID, i), a4, a6)
	}
	return out, nil
}

// lease writes one NIC's lease: the static addresses asked for, or the lowest free ones.
func lease(ctx context.Context, tx pgx.Tx, n Network, instanceID string, nic int, want InstanceNIC, field string) (netip.Addr, netip.Addr, error) {
	p4, p6, err := ranges(n)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	gw4, _ := netip.ParseAddr(n.Gateway)
	var static4, static6 netip.Addr
	if want.Address != "" {
		if static4, err = staticIn(field+".address", want.Address, p4, gw4); err != nil {
			return static4, static6, err
		}
	}
	if want.Address6 != "" {
		if !p6.IsValid() {
			return static4, static6, api.InvalidField(field+".address6", "network %s has no IPv6 range (cidr6)", n.Name)
		}
		gw6, _ := netip.ParseAddr(n.Gateway6)
		if static6, err = staticIn(field+".address6", want.Address6, p6, gw6); err != nil {
			return static4, static6, err
		}
	}
	for range allocateAttempts {
		a4, a6 := static4, static6
		if !a4.IsValid() {
			if a4, err = lowestFree(ctx, tx, n, false); err != nil {
				return a4, a6, err
			}
		}
		if p6.IsValid() && !a6.IsValid() {
			if a6, err = lowestFree(ctx, tx, n, true); err != nil {
				return a4, a6, err
			}
		}
		var addr6 *string
		if a6.IsValid() {
			s := a6.String()
			addr6 = &s
		}
		tag, err := tx.Exec(ctx, `INSERT INTO compute.vps_addresses (network_id, instance_id, nic, mac, address, address6, static)
			VALUES ($1, $2, $3, $4, $5::inet, $6::inet, $7) ON CONFLICT DO NOTHING`,
			n.ID, instanceID, nic, nicMAC(instanceID, nic), a4.String(), addr6, static4.IsValid() || static6.IsValid())
		if err != nil {
			return a4, a6, err
		}
		if tag.RowsAffected() == 1 {
			return a4, a6, nil
		}
		// Refused by an exclusion constraint, after any concurrent holder committed: a static
		// address is then taken; a picked one lost a race, and the next pick sees the winner.
		for _, s := range []struct {
			a     netip.Addr
			field string
		}{{static4, field + ".address"}, {static6, field + ".address6"}} {
			if s.a.IsValid() && leasedAddr(ctx, tx, n.ID, s.a) {
				return a4, a6, api.Errorf(api.CodeConflict, "%s is taken on network %s", s.a, n.Name).
					With("reason", "address_taken").With("field", s.field).With("address", s.a.String())
			}
		}
	}
	return netip.Addr{}, netip.Addr{}, modules.Retry(api.Errorf(api.CodeConflict,
		"the addresses of network %s were taken concurrently %d times; try again", n.Name, allocateAttempts).With("reason", "allocation_contended"))
}

// ranges reads a network's prefixes (the IPv6 one invalid when it has none).
func ranges(n Network) (netip.Prefix, netip.Prefix, error) {
	p4, err := netip.ParsePrefix(n.CIDR)
	if err != nil {
		return p4, netip.Prefix{}, fmt.Errorf("vps: network %s's cidr %q: %w", n.ID, n.CIDR, err)
	}
	if n.CIDR6 == "" {
		return p4, netip.Prefix{}, nil
	}
	p6, err := netip.ParsePrefix(n.CIDR6)
	if err != nil {
		return p4, p6, fmt.Errorf("vps: network %s's cidr6 %q: %w", n.ID, n.CIDR6, err)
	}
	return p4, p6, nil
}

// staticIn checks a static address asked of range p: a host address of it, not its gateway.
func staticIn(field, s string, p netip.Prefix, gateway netip.Addr) (netip.Addr, error) {
	a, err := hostIn(field, s, p, true)
	if err != nil {
		return a, err
	}
	if a == gateway {
		return a, api.InvalidField(field, "%s is the network's gateway", a)
	}
	return a, nil
}

func leasedAddr(ctx context.Context, tx pgx.Tx, network string, a netip.Addr) bool {
	col := "address"
	if a.Is6() {
		col = "address6"
	}
	var taken bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.vps_addresses WHERE network_id = $1 AND `+col+` = $2::inet)`, network, a.String()).Scan(&taken)
	return err == nil && taken
}

// lowestFreeSQL finds the lowest free address of a network. The lowest free address is its
// first host address, the one after its gateway, the one after its reserved range, or the one
// after a lease: "cheap" is the least of the first three that is free, and the walk reads the
// leases below it in address order (the (network_id, address) index), with the next lease of
// each beside it, up to the first whose successor is free and may be given. It reads no lease
// above the answer: picking in a sparse network reads a few rows, in a packed one the leases
// up to the first gap, in the database. COL is address or address6; $1 is the network, $2 its
// first and $3 its last host address, $4 its gateway, $5 and $6 its reserved range (NULL when
// none).
const lowestFreeSQL = `
WITH cheap AS (
  SELECT min(c.a) AS a FROM (VALUES ($2::inet), (CASE WHEN $4::inet < $3::inet THEN $4::inet + 1 END),
    (CASE WHEN $6::inet < $3::inet THEN $6::inet + 1 END)) c (a)
  WHERE c.a BETWEEN $2::inet AND $3::inet AND c.a <> $4::inet AND NOT coalesce(c.a BETWEEN $5::inet AND $6::inet, false)
    AND NOT EXISTS (SELECT 1 FROM compute.vps_addresses x WHERE x.network_id = $1 AND x.COL = c.a)
)
SELECT host(least((SELECT a FROM cheap), (
  SELECT w.at + 1 FROM (
    SELECT l.COL AS at, lead(l.COL) OVER (ORDER BY l.COL) AS next FROM compute.vps_addresses l
    WHERE l.network_id = $1 AND l.COL >= $2::inet AND l.COL <= coalesce((SELECT a FROM cheap), $3::inet)
  ) w
  WHERE w.at < $3::inet AND (w.next IS NULL OR w.next <> w.at + 1) AND w.at + 1 <> $4::inet
    AND NOT coalesce(w.at + 1 BETWEEN $5::inet AND $6::inet, false)
  ORDER BY w.at LIMIT 1)))`

var (
	lowestFree4SQL = strings.ReplaceAll(lowestFreeSQL, "COL", "address")
	lowestFree6SQL = strings.ReplaceAll(lowestFreeSQL, "COL", "address6")
)

// lowestFree picks the lowest free address of n (of its IPv6 range when v6), or answers that
// it has none.
func lowestFree(ctx context.Context, q postgres.Querier, n Network, v6 bool) (netip.Addr, error) {
	p4, p6, err := ranges(n)
	if err != nil {
		return netip.Addr{}, err
	}
	query, p, gw := lowestFree4SQL, p4, n.Gateway
	last := lastAddr(p).Prev() // the broadcast address is no host's
	var rf, rl *string
	if r := n.Reserved; r != nil {
		rf, rl = &r.First, &r.Last
	}
	if v6 {
		query, p, gw, rf, rl = lowestFree6SQL, p6, n.Gateway6, nil, nil
		last = lastAddr(p)
	}
	var got *string
	if err := q.QueryRow(ctx, query, n.ID, p.Addr().Next().String(), last.String(), gw, rf, rl).Scan(&got); err != nil {
		return netip.Addr{}, fmt.Errorf("vps: pick an address of network %s: %w", n.ID, err)
	}
	if got == nil {
		return netip.Addr{}, api.Errorf(api.CodeConflict, "network %s has no free address in %s: delete instances on it, or use another network", n.Name, p).
			With("reason", "addresses_exhausted").With("network", n.ID)
	}
	return netip.ParseAddr(*got)
}

// releaseAddresses frees every address an instance leased; they may be leased again once the
// caller's transaction commits. It answers how many NICs it released.
func releaseAddresses(ctx context.Context, tx pgx.Tx, instanceID string) (int, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM compute.vps_addresses WHERE instance_id = $1`, instanceID)
	if err != nil {
		return 0, fmt.Errorf("vps: release instance %s's addresses: %w", instanceID, err)
	}
	return int(tag.RowsAffected()), nil
}

// hostNIC is what a host needs of a NIC: where to plug it and what to tell the guest.
func hostNIC(n Network, mac string, a4, a6 netip.Addr) hostapi.NIC {
	p4, _ := netip.ParsePrefix(n.CIDR)
	nic := hostapi.NIC{Network: n.ID, MAC: mac, Bridge: n.Bridge, VLAN: n.VLAN,
		Addresses: []string{netip.PrefixFrom(a4, p4.Bits()).String()}, Gateway: n.Gateway, DNS: slices.Clone(n.DNS)}
	if a6.IsValid() {
		p6, _ := netip.ParsePrefix(n.CIDR6)
		nic.Addresses = append(nic.Addresses, netip.PrefixFrom(a6, p6.Bits()).String())
		nic.Gateway6 = n.Gateway6
	}
	return nic
}

// instanceNICs reads the NICs of instances, in their order, by instance id: what their hosts'
// desired state carries.
func instanceNICs(ctx context.Context, q postgres.Querier, instanceIDs []string) (map[string][]hostapi.NIC, error) {
	rows, err := q.Query(ctx, `SELECT a.instance_id::text, a.mac::text, host(a.address), host(a.address6), n.*
		FROM compute.vps_addresses a CROSS JOIN LATERAL (SELECT `+networkColumns+` FROM compute.vps_networks WHERE id = a.network_id) n
		WHERE a.instance_id::text = ANY($1) ORDER BY a.instance_id, a.nic`, instanceIDs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]hostapi.NIC{}
	for rows.Next() {
		var id, mac, a4 string
		var a6 *string
		n, err := scanNetwork(prefixScan{rows, []any{&id, &mac, &a4, &a6}})
		if err != nil {
			return nil, err
		}
		addr4, err := netip.ParseAddr(a4)
		if err != nil {
			return nil, err
		}
		var addr6 netip.Addr
		if a6 != nil {
			if addr6, err = netip.ParseAddr(*a6); err != nil {
				return nil, err
			}
		}
		out[id] = append(out[id], hostNIC(n, mac, addr4, addr6))
	}
	return out, rows.Err()
}

// prefixScan scans leading columns into first, the rest into what Scan is given.
type prefixScan struct {
	row   pgx.Row
	first []any
}

func (p prefixScan) Scan(dest ...any) error { return p.row.Scan(append(p.first, dest...)...) }

func listAddresses(ctx context.Context, c *modules.Call, in ListAddresses) (api.Page[AddressLease], error) {
	var after *string
	if in.Cursor != "" {
		key, err := api.DecodeCursor("va1", in.Cursor)
		if err != nil {
			return api.Page[AddressLease]{}, err
		}
		if _, err := netip.ParseAddr(key); err != nil {
			return api.Page[AddressLease]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
		}
		after = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT network_id::text, instance_id::text, nic, mac::text, host(address), host(address6), static, created_at
		FROM compute.vps_addresses WHERE network_id = $1 AND ($2::inet IS NULL OR address > $2::inet) ORDER BY address LIMIT $3`,
		c.Target.ResourceID, after, limit+1)
	if err != nil {
		return api.Page[AddressLease]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AddressLease, error) {
		var a AddressLease
		var a6 *string
		err := r.Scan(&a.NetworkID, &a.InstanceID, &a.NIC, &a.MAC, &a.Address, &a6, &a.Static, &a.CreatedAt)
		if a6 != nil {
			a.Address6 = *a6
		}
		return a, err
	})
	if err != nil {
		return api.Page[AddressLease]{}, err
	}
	return api.PageOf(items, limit, "va1", func(a AddressLease) string { return a.Address }), nil
}
