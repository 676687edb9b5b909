package vps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Networks: a tenant's IPv4 (and optionally IPv6) ranges on a host bridge, optionally on a VLAN,
// that its instances' NICs attach to and take their addresses from (ipam.go).

// ResourceNetwork is the IAM resource type of networks.
const ResourceNetwork = "vps-network"

// Events of networks; the subject is the network.
const (
	EventNetworkCreated = "network.created"
	EventNetworkDeleted = "network.deleted"
)

// The networks' methods.
var (
	NetworksCreate    = api.NewMethod[CreateNetwork, Network]("networks", "create", true, ResourceNetwork, "v0.5", "Define a network: an IPv4 range (and optionally an IPv6 one) on a host bridge, optionally on a VLAN, that instances take addresses from.")
	NetworksGet       = api.NewMethod[NetworkRef, Network]("networks", "get", false, ResourceNetwork, "v0.5", "Get a network.")
	NetworksList      = api.NewMethod[ListNetworks, api.Page[Network]]("networks", "list", false, ResourceNetwork, "v0.5", "List networks.")
	NetworksDelete    = api.NewMethod[NetworkRef, Network]("networks", "delete", true, ResourceNetwork, "v0.5", "Remove a network no instance has an address on.")
	NetworksAddresses = api.NewMethod[ListAddresses, api.Page[AddressLease]]("networks", "addresses", false, ResourceNetwork, "v0.5", "List a network's address leases: which instance's NIC holds which address, in address order.")
)

// Limits of a network.
const (
	MinPrefix4, MaxPrefix4 = 8, 30   // a /30 still has a gateway and one instance
	MinPrefix6, MaxPrefix6 = 48, 126 // a /64 is the usual
	MaxDNS                 = 8
)

// Network is a range instances take addresses from, on a host bridge (and VLAN).
type Network struct {
	ID       string   `json:"id"`
	TenantID string   `json:"tenantId"`
	Name     string   `json:"name"`
	CIDR     string   `json:"cidr"`    // 10.20.0.0/24
	Gateway  string   `json:"gateway"` // 10.20.0.1
	CIDR6    string   `json:"cidr6,omitempty"`
	Gateway6 string   `json:"gateway6,omitempty"`
	DNS      []string `json:"dns"`
	VLAN     int      `json:"vlan,omitempty"` // 0: untagged
	Bridge   string   `json:"bridge"`         // the host bridge its NICs plug into
	// Reserved is kept for static addresses: the allocator never picks one of it.
	Reserved  *AddressRange `json:"reserved,omitempty"`
	CreatedBy string        `json:"createdBy"`
	CreatedAt time.Time     `json:"createdAt"`
}

// AddressRange is a range of IPv4 addresses, both ends included.
type AddressRange struct {
	First string `json:"first"`
	Last  string `json:"last"`
}

// CreateNetwork is the input of networks.create.
type CreateNetwork struct {
	TenantID string `json:"tenantId,omitempty"`
	Name     string `json:"name"`
	CIDR     string `json:"cidr"`              // required: the IPv4 range, e.g. 10.20.0.0/24
	Gateway  string `json:"gateway,omitempty"` // default: the range's first address (10.20.0.1)
	// CIDR6, if set, gives NICs an IPv6 address too; Gateway6 defaults to its first address
	// and may be link-local (fe80::1).
	CIDR6    string   `json:"cidr6,omitempty"`
	Gateway6 string   `json:"gateway6,omitempty"`
	DNS      []string `json:"dns,omitempty"`  // resolvers the guests are told
	VLAN     int      `json:"vlan,omitempty"` // 1-4094; 0 or absent: untagged
	// Bridge is the host bridge; default br0 untagged, br<vlan> on a VLAN.
	Bridge   string        `json:"bridge,omitempty"`
	Reserved *AddressRange `json:"reserved,omitempty"`
}

// Validate implements the input check.
func (in CreateNetwork) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	_, err := in.spec()
	return err
}

// networkSpec is a CreateNetwork checked, its defaults filled. Zero values are absent.
type networkSpec struct {
	cidr, cidr6                 netip.Prefix
	gateway, gateway6           netip.Addr
	dns                         []netip.Addr
	vlan                        int
	bridge                      string
	reservedFirst, reservedLast netip.Addr
}

var bridgeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

// spec checks a network's ranges and addresses, saying which field is wrong and how.
func (in CreateNetwork) spec() (networkSpec, error) {
	var s networkSpec
	var err error
	if s.cidr, err = parseRange("cidr", in.CIDR, false); err != nil {
		return s, err
	}
	if s.gateway, err = hostIn("gateway", in.Gateway, s.cidr, false); err != nil {
		return s, err
	}
	if in.CIDR6 == "" && in.Gateway6 != "" {
		return s, api.InvalidField("gateway6", "goes with cidr6, which is not set")
	}
	if in.CIDR6 != "" {
		if s.cidr6, err = parseRange("cidr6", in.CIDR6, true); err != nil {
			return s, err
		}
		if s.gateway6, err = hostIn("gateway6", in.Gateway6, s.cidr6, false); err != nil {
			return s, err
		}
	}
	if len(in.DNS) > MaxDNS {
		return s, api.InvalidField("dns", "has %d resolvers; the limit is %d", len(in.DNS), MaxDNS)
	}
	for i, d := range in.DNS {
		a, err := netip.ParseAddr(d)
		if err != nil || a.Zone() != "" {
			return s, api.InvalidField(fmt.Sprintf("dns[%d]", i), "%q is not an IP address", d)
		}
		s.dns = append(s.dns, a.Unmap())
	}
	if in.VLAN < 0 || in.VLAN > 4094 {
		return s, api.InvalidField("vlan", "%d is out of range: a VLAN id is 1 to 4094 (0 or absent: untagged)", in.VLAN)
	}
	s.vlan = in.VLAN
	switch s.bridge = in.Bridge; {
	case s.bridge == "" && s.vlan == 0:
		s.bridge = "br0"
	case s.bridge == "":
		s.bridge = fmt.Sprintf("br%d", s.vlan)
	case !bridgeRE.MatchString(s.bridge):
		return s, api.InvalidField("bridge", "%q is not a Linux interface name: 1 to 15 letters, digits and '_.-', starting with a letter or digit", s.bridge)
	}
	if r := in.Reserved; r != nil {
		if s.reservedFirst, err = hostIn("reserved.first", r.First, s.cidr, true); err != nil {
			return s, err
		}
		if s.reservedLast, err = hostIn("reserved.last", r.Last, s.cidr, true); err != nil {
			return s, err
		}
		if s.reservedLast.Less(s.reservedFirst) {
			return s, api.InvalidField("reserved", "ends (%s) before it starts (%s)", s.reservedLast, s.reservedFirst)
		}
	}
	return s, nil
}

// parseRange reads a network's range: IPv4 (or IPv6 when v6), no host bits set, of a size a
// network may have.
func parseRange(field, s string, v6 bool) (netip.Prefix, error) {
	family, example, lo, hi := "IPv4", "10.20.0.0/24", MinPrefix4, MaxPrefix4
	if v6 {
		family, example, lo, hi = "IPv6", "2001:db8:20::/64", MinPrefix6, MaxPrefix6
	}
	if s == "" {
		return netip.Prefix{}, api.InvalidField(field, "is required: the network's %s range, e.g. %s", family, example)
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, api.InvalidField(field, "%q is not a CIDR range (an address, '/' and a prefix length, e.g. %s)", s, example)
	}
	if p.Addr().Is4() == v6 || p.Addr().Is4In6() {
		return p, api.InvalidField(field, "%s is not an %s range", s, family)
	}
	if p.Bits() < lo || p.Bits() > hi {
		return p, api.InvalidField(field, "a /%d is out of range: an %s network is /%d to /%d", p.Bits(), family, lo, hi)
	}
	if p.Masked() != p {
		return p, api.InvalidField(field, "%s has host bits set: the range is %s", s, p.Masked())
	}
	return p, nil
}

// hostIn reads an address of range p that a host may have: not the range's own address, nor
// (IPv4) its broadcast address. Empty is p's first host address unless required; a gateway6 may
// also be link-local.
func hostIn(field, s string, p netip.Prefix, required bool) (netip.Addr, error) {
	if s == "" {
		if required {
			return netip.Addr{}, api.InvalidField(field, "is required")
		}
		return p.Addr().Next(), nil
	}
	a, err := netip.ParseAddr(s)
	v6 := p.Addr().Is6()
	if err != nil || a.Zone() != "" || a.Is4() == v6 || a.Is4In6() {
		return a, api.InvalidField(field, "%q is not an %s address", s, map[bool]string{false: "IPv4", true: "IPv6"}[v6])
	}
	switch {
	case field == "gateway6" && a.IsLinkLocalUnicast():
		return a, nil
	case !p.Contains(a):
		return a, api.InvalidField(field, "%s is outside the network's range %s", a, p)
	case a == p.Addr():
		return a, api.InvalidField(field, "%s is the range's own address, which no host may have", a)
	case !v6 && a == lastAddr(p):
		return a, api.InvalidField(field, "%s is the range's broadcast address, which no host may have", a)
	}
	return a, nil
}

// lastAddr is the last address of p: IPv4's broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 96
	}
	for i := off + p.Bits(); i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// NetworkRef names a network.
type NetworkRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Network  string `json:"network"` // id or name
}

// Validate implements the input check.
func (in NetworkRef) Validate() error { return api.ValidateRef("network", in.Network) }

// ListNetworks is the input of networks.list.
type ListNetworks struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// ListAddresses is the input of networks.addresses.
type ListAddresses struct {
	TenantID string `json:"tenantId,omitempty"`
	Network  string `json:"network"` // id or name
	api.PageRequest
}

// Validate implements the input check.
func (in ListAddresses) Validate() error {
	if err := api.ValidateRef("network", in.Network); err != nil {
		return err
	}
	return in.PageRequest.Validate()
}

// AddressLease is a lease: the addresses of one NIC of an instance on a network.
type AddressLease struct {
	NetworkID  string    `json:"networkId"`
	InstanceID string    `json:"instanceId"`
	NIC        int       `json:"nic"` // its index among the instance's NICs
	MAC        string    `json:"mac"`
	Address    string    `json:"address"` // 10.20.0.7
	Address6   string    `json:"address6,omitempty"`
	Static     bool      `json:"static,omitempty"` // asked for by address, not picked
	CreatedAt  time.Time `json:"createdAt"`
}

const networkColumns = `id::text, tenant_id, name, cidr, gateway, cidr6, gateway6, dns, coalesce(vlan, 0), bridge, reserved_first, reserved_last, created_by, created_at`

func scanNetwork(row pgx.Row) (Network, error) {
	var n Network
	var cidr netip.Prefix
	var gw netip.Addr
	var cidr6 *netip.Prefix
	var gw6, rf, rl *netip.Addr
	var dns []netip.Addr
	if err := row.Scan(&n.ID, &n.TenantID, &n.Name, &cidr, &gw, &cidr6, &gw6, &dns, &n.VLAN, &n.Bridge, &rf, &rl, &n.CreatedBy, &n.CreatedAt); err != nil {
		return n, err
	}
	n.CIDR, n.Gateway = cidr.String(), gw.String()
	if cidr6 != nil && gw6 != nil {
		n.CIDR6, n.Gateway6 = cidr6.String(), gw6.String()
	}
	n.DNS = make([]string, len(dns))
	for i, d := range dns {
		n.DNS[i] = d.String()
	}
	if rf != nil && rl != nil {
		n.Reserved = &AddressRange{First: rf.String(), Last: rl.String()}
	}
	return n, nil
}

var networkTarget = lookupRef("network", "vps_networks")

// networkOf finds a network of the tenant by id or name.
func networkOf(ctx context.Context, q postgres.Querier, tenant, ref string) (Network, error) {
	n, err := scanNetwork(q.QueryRow(ctx, `SELECT `+networkColumns+` FROM compute.vps_networks WHERE tenant_id = $1 AND (id::text = $2 OR name = $2)
		ORDER BY (id::text = $2) DESC LIMIT 1`, tenant, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return n, api.NotFound("network", ref)
	}
	return n, err
}

func (m *Module) registerNetworks(r *modules.Registry) {
	r.ResourceTypes(iam.ResourceType{Name: ResourceNetwork, Description: "A network: an address range on a host bridge (and VLAN) that instances take addresses from."})
	r.EventTypes(
		modules.EventType{Name: EventNetworkCreated, Description: "A network was created (data: name, cidr, vlan, bridge)."},
		modules.EventType{Name: EventNetworkDeleted, Description: "A network was deleted (data: name)."},
	)
	modules.Handle(r, NetworksCreate, nil, createNetwork)
	ref := func(ctx context.Context, l modules.Lookup, in NetworkRef) (modules.Target, error) {
		return networkTarget(ctx, l, in.TenantID, in.Network)
	}
	modules.Handle(r, NetworksGet, ref, func(ctx context.Context, c *modules.Call, in NetworkRef) (Network, error) {
		return networkOf(ctx, c.Tx, c.Target.TenantID, c.Target.ResourceID)
	})
	modules.Handle(r, NetworksList, nil, func(ctx context.Context, c *modules.Call, in ListNetworks) (api.Page[Network], error) {
		return pageByName(ctx, c.Tx, "vw1", networkColumns, "vps_networks", false, c.Target.TenantID, in.Cursor, in.PageLimit(), scanNetwork, func(n Network) string { return n.Name })
	})
	modules.Handle(r, NetworksDelete, ref, deleteNetwork)
	modules.Handle(r, NetworksAddresses, func(ctx context.Context, l modules.Lookup, in ListAddresses) (modules.Target, error) {
		return networkTarget(ctx, l, in.TenantID, in.Network)
	}, listAddresses)
}

func createNetwork(ctx context.Context, c *modules.Call, in CreateNetwork) (Network, error) {
	s, err := in.spec()
	if err != nil {
		return Network{}, err
	}
	var cidr6 *netip.Prefix
	var gw6, rf, rl *netip.Addr
	if s.cidr6.IsValid() {
		cidr6, gw6 = &s.cidr6, &s.gateway6
	}
	if s.reservedFirst.IsValid() {
		rf, rl = &s.reservedFirst, &s.reservedLast
	}
	var vlan *int
	if s.vlan > 0 {
		vlan = &s.vlan
	}
	dns := s.dns
	if dns == nil {
		dns = []netip.Addr{}
	}
	id := uuid.Must(uuid.NewV7()).String()
	n, err := scanNetwork(c.Tx.QueryRow(ctx, `INSERT INTO compute.vps_networks (id, tenant_id, name, cidr, gateway, cidr6, gateway6, dns, vlan, bridge, reserved_first, reserved_last, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING `+networkColumns,
		id, c.Target.TenantID, in.Name, s.cidr, s.gateway, cidr6, gw6, dns, vlan, s.bridge, rf, rl, c.Principal.ID))
	if err != nil {
		return n, networkConflict(err, in.Name, s)
	}
	return n, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventNetworkCreated, TenantID: c.Target.TenantID, Subject: id,
		Data: map[string]any{"name": n.Name, "cidr": n.CIDR, "vlan": n.VLAN, "bridge": n.Bridge}})
}

// networkConflict says which constraint refused a new network. Another tenant's network is not
// named: a caller learns only that the segment is taken.
func networkConflict(err error, name string, s networkSpec) error {
	var constraint string
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) {
		constraint = pe.ConstraintName
	}
	switch code := postgres.ErrorCode(err); {
	case code == postgres.UniqueViolation:
		return api.Errorf(api.CodeConflict, "the tenant has a network named %q", name).With("reason", "name_taken")
	case code != postgres.ExclusionViolation:
		return err
	case constraint == "vps_networks_tenant_overlap":
		return api.Errorf(api.CodeConflict, "%s overlaps another of the tenant's networks: a tenant's ranges may not overlap", s.cidr).With("reason", "overlap").With("field", "cidr")
	case constraint == "vps_networks_tenant_overlap6":
		return api.Errorf(api.CodeConflict, "%s overlaps another of the tenant's networks: a tenant's ranges may not overlap", s.cidr6).With("reason", "overlap").With("field", "cidr6")
	case constraint == "vps_networks_segment_overlap":
		return api.Errorf(api.CodeConflict, "another network on bridge %s (VLAN %d) overlaps %s: one segment has one address plan", s.bridge, s.vlan, s.cidr).
			With("reason", "segment_overlap").With("field", "cidr")
	case constraint == "vps_networks_bridge_vlan":
		return api.Errorf(api.CodeConflict, "bridge %s carries another VLAN for another network: a bridge carries one VLAN (give another bridge)", s.bridge).
			With("reason", "bridge_vlan").With("field", "bridge")
	}
	return err
}

func deleteNetwork(ctx context.Context, c *modules.Call, in NetworkRef) (Network, error) {
	var leases int
	if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.vps_addresses WHERE network_id = $1`, c.Target.ResourceID).Scan(&leases); err != nil {
		return Network{}, err
	}
	if leases > 0 {
		return Network{}, api.Errorf(api.CodeFailedPrecondition, "network %s has %d address(es) leased to instances: delete them first", in.Network, leases).With("reason", "in_use")
	}
	n, err := scanNetwork(c.Tx.QueryRow(ctx, `DELETE FROM compute.vps_networks WHERE id = $1 RETURNING `+networkColumns, c.Target.ResourceID))
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		// An instance created concurrently leased an address after the count.
		return n, modules.Retry(api.Errorf(api.CodeFailedPrecondition, "network %s has addresses leased to instances", in.Network).With("reason", "in_use"))
	}
	if err != nil {
		return n, err
	}
	return n, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventNetworkDeleted, TenantID: n.TenantID, Subject: n.ID, Data: map[string]any{"name": n.Name}})
}
