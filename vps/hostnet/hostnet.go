// Package hostnet makes a VM host's network segments through netlink, for the vps module's node
// side: a Linux bridge per network (hostapi.NIC.Bridge) and, for a network on a VLAN, a VLAN
// sub-interface of the host's uplink (eth0.100) as that bridge's port. Instances' NICs are then
// plugged into the bridge untagged and are on the VLAN. Every call converges: asked twice, it
// changes nothing the second time, and it refuses, saying what is in the way, rather than take
// over a link it did not make for this purpose.
package hostnet

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routeFamily is NETLINK_ROUTE, spelled here so that the package builds on every platform
// (netlink answers "not implemented" off Linux).
const routeFamily = 0

// errExist is LinkAdd's answer when another process made the link first.
var errExist = unix.EEXIST

// Segment is one network's part of a host.
type Segment struct {
	Bridge string // the bridge instances' NICs plug into, e.g. br100
	VLAN   int    // 1-4094; 0: untagged, and the bridge is made (when missing) with no port
	Uplink string // the host's interface that carries the VLANs (eth0, bond0); needed with a VLAN
}

var ifnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

// Validate checks s's names and VLAN id.
func (s Segment) Validate() error {
	if !ifnameRE.MatchString(s.Bridge) {
		return fmt.Errorf("hostnet: bridge %q is not an interface name (1 to 15 letters, digits and '_.-')", s.Bridge)
	}
	if s.VLAN < 0 || s.VLAN > 4094 {
		return fmt.Errorf("hostnet: VLAN %d is out of range (1 to 4094, 0 for untagged)", s.VLAN)
	}
	if s.VLAN > 0 && !ifnameRE.MatchString(s.Uplink) {
		return fmt.Errorf("hostnet: bridge %s is on VLAN %d, which needs the host's uplink interface (bcd node --vps-uplink), not %q", s.Bridge, s.VLAN, s.Uplink)
	}
	return nil
}

// VLANName is the name of the VLAN sub-interface of uplink for vlan: uplink.vlan, the uplink's
// name shortened to fit Linux's 15 characters.
func VLANName(uplink string, vlan int) string {
	suffix := "." + strconv.Itoa(vlan)
	if len(uplink)+len(suffix) > 15 {
		uplink = uplink[:15-len(suffix)]
	}
	return uplink + suffix
}

// Links changes the links of one network namespace. It speaks rtnetlink only: netlink's
// default handle also opens XFRM and netfilter sockets, which fail where their modules
// (xfrm_user) are not loaded.
type Links struct{ h *netlink.Handle }

// New returns Links of the calling process's network namespace.
func New() (*Links, error) {
	h, err := netlink.NewHandle(routeFamily)
	if err != nil {
		return nil, fmt.Errorf("hostnet: netlink: %w", err)
	}
	return &Links{h: h}, nil
}

// At returns Links of the network namespace ns.
func At(ns netns.NsHandle) (*Links, error) {
	h, err := netlink.NewHandleAt(ns, routeFamily)
	if err != nil {
		return nil, fmt.Errorf("hostnet: netlink in namespace %s: %w", ns, err)
	}
	return &Links{h: h}, nil
}

// Close releases the netlink sockets.
func (l *Links) Close() { l.h.Close() }

// Ensure makes s exist and be up: its bridge, and on a VLAN, the uplink's sub-interface for it
// as the bridge's port. Of the uplink (the host's), Ensure changes nothing but to set it up
// when it is down, as a VLAN cannot be up on a parent that is down. Everything in the way is
// found before anything is made, so a refusal leaves the host as it was.
func (l *Links) Ensure(s Segment) error {
	if err := s.Validate(); err != nil {
		return err
	}
	br, err := l.bridge(s.Bridge, false)
	if err != nil {
		return err
	}
	var v netlink.Link
	if s.VLAN > 0 {
		if v, err = l.vlan(s, false); err != nil {
			return err
		}
		if br != nil {
			if err := l.carriesOnly(br, s.VLAN, v); err != nil {
				return err
			}
		}
		if m := masterOf(v); m != 0 && (br == nil || m != br.Attrs().Index) {
			return fmt.Errorf("hostnet: %s is a port of another bridge (index %d), not of %s", v.Attrs().Name, m, s.Bridge)
		}
	}
	if br == nil {
		if br, err = l.bridge(s.Bridge, true); err != nil {
			return err
		}
	}
	if s.VLAN > 0 {
		if v == nil {
			if v, err = l.vlan(s, true); err != nil {
				return err
			}
		}
		up, err := l.find(s.Uplink)
		if err != nil || up == nil {
			return fmt.Errorf("hostnet: the uplink %s went away: %v", s.Uplink, err)
		}
		if err := l.up(up); err != nil {
			return err
		}
		if v.Attrs().MasterIndex != br.Attrs().Index {
			if err := l.h.LinkSetMaster(v, br); err != nil {
				return fmt.Errorf("hostnet: make %s a port of %s: %w", v.Attrs().Name, s.Bridge, err)
			}
		}
		if err := l.up(v); err != nil {
			return err
		}
	}
	return l.up(br)
}

func masterOf(l netlink.Link) int {
	if l == nil {
		return 0
	}
	return l.Attrs().MasterIndex
}

// Remove deletes a VLAN segment once no instance uses it: its bridge and the uplink's
// sub-interface, when the bridge has no other port (an instance's tap). A bridge in use, or
// one already gone, is left without error. An untagged segment's bridge is the host's (br0 may
// carry the host's own address) and is never removed.
func (l *Links) Remove(s Segment) (removed bool, err error) {
	if err := s.Validate(); err != nil || s.VLAN == 0 {
		return false, err
	}
	br, err := l.bridge(s.Bridge, false)
	if br == nil || err != nil {
		return false, err
	}
	v, err := l.vlan(s, false)
	if err != nil {
		return false, err
	}
	ports, err := l.ports(br)
	if err != nil {
		return false, err
	}
	for _, p := range ports {
		if v == nil || p.Attrs().Index != v.Attrs().Index {
			return false, nil // an instance is still plugged in
		}
	}
	if v != nil {
		if err := l.h.LinkDel(v); err != nil {
			return false, fmt.Errorf("hostnet: delete %s: %w", v.Attrs().Name, err)
		}
	}
	if err := l.h.LinkDel(br); err != nil {
		return false, fmt.Errorf("hostnet: delete bridge %s: %w", s.Bridge, err)
	}
	return true, nil
}

// bridge finds the bridge name, made when missing if create is set (nil when missing otherwise).
func (l *Links) bridge(name string, create bool) (netlink.Link, error) {
	link, err := l.find(name)
	if err != nil {
		return nil, err
	}
	if link == nil && create {
		if err := l.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil && !errors.Is(err, errExist) {
			return nil, fmt.Errorf("hostnet: make bridge %s: %w", name, err)
		}
		if link, err = l.find(name); err != nil || link == nil {
			return nil, fmt.Errorf("hostnet: bridge %s was made but is not found: %v", name, err)
		}
	}
	if link != nil && link.Type() != "bridge" {
		return nil, fmt.Errorf("hostnet: %s exists and is a %s link, not a bridge", name, link.Type())
	}
	return link, nil
}

// vlan finds s's VLAN sub-interface of the uplink, made when missing if create is set (nil when
// missing otherwise). A link of its name that is another VLAN, or on another parent, is refused.
func (l *Links) vlan(s Segment, create bool) (netlink.Link, error) {
	up, err := l.find(s.Uplink)
	if err != nil {
		return nil, err
	}
	if up == nil {
		return nil, fmt.Errorf("hostnet: the uplink %s is not an interface of this host", s.Uplink)
	}
	name := VLANName(s.Uplink, s.VLAN)
	link, err := l.find(name)
	if err != nil {
		return nil, err
	}
	if link == nil && create {
		err := l.h.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: up.Attrs().Index}, VlanId: s.VLAN})
		if err != nil && !errors.Is(err, errExist) {
			return nil, fmt.Errorf("hostnet: make %s (VLAN %d of %s): %w", name, s.VLAN, s.Uplink, err)
		}
		if link, err = l.find(name); err != nil || link == nil {
			return nil, fmt.Errorf("hostnet: %s was made but is not found: %v", name, err)
		}
	}
	if link == nil {
		return nil, nil
	}
	v, ok := link.(*netlink.Vlan)
	if !ok || v.VlanId != s.VLAN || v.Attrs().ParentIndex != up.Attrs().Index {
		return nil, fmt.Errorf("hostnet: %s exists and is not VLAN %d of %s (it is a %s link): remove it or use another uplink name", name, s.VLAN, s.Uplink, describe(link))
	}
	return v, nil
}

// carriesOnly refuses a bridge that has another VLAN sub-interface as a port than v (nil
// when not made yet): a bridge carries one VLAN.
func (l *Links) carriesOnly(br netlink.Link, vlan int, v netlink.Link) error {
	ports, err := l.ports(br)
	if err != nil {
		return err
	}
	for _, p := range ports {
		if o, ok := p.(*netlink.Vlan); ok && (v == nil || o.Attrs().Index != v.Attrs().Index) && o.VlanId != vlan {
			return fmt.Errorf("hostnet: bridge %s already carries VLAN %d through %s: a bridge carries one VLAN", br.Attrs().Name, o.VlanId, o.Attrs().Name)
		}
	}
	return nil
}

func (l *Links) ports(br netlink.Link) ([]netlink.Link, error) {
	all, err := l.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("hostnet: list links: %w", err)
	}
	var out []netlink.Link
	for _, link := range all {
		if link.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, link)
		}
	}
	return out, nil
}

func (l *Links) up(link netlink.Link) error {
	if link.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := l.h.LinkSetUp(link); err != nil {
		return fmt.Errorf("hostnet: set %s up: %w", link.Attrs().Name, err)
	}
	return nil
}

// find returns the link name, or nil when there is none.
func (l *Links) find(name string) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hostnet: find %s: %w", name, err)
	}
	return link, nil
}

func describe(link netlink.Link) string {
	if v, ok := link.(*netlink.Vlan); ok {
		return fmt.Sprintf("VLAN %d (parent index %d)", v.VlanId, v.Attrs().ParentIndex)
	}
	return link.Type()
}
