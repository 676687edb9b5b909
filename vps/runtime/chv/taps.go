package chv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/vishvananda/netlink"
)

// Tap is the host side of one NIC: a tap device, a port of Bridge, on VLAN (0: untagged).
type Tap struct {
	Name   string `json:"name"`
	Bridge string `json:"bridge"`
	VLAN   int    `json:"vlan,omitempty"`
}

// Taps makes and removes the tap devices of instances' NICs. Both calls converge: Ensure of a tap
// that is as asked and Delete of one that does not exist do nothing.
type Taps interface {
	Ensure(ctx context.Context, t Tap) error
	Delete(ctx context.Context, name string) error
}

// tapName is the name of an instance's nth tap: "bc", ten hex digits of a hash of the id and n,
// so that it fits the 15 bytes of a Linux interface name whatever the id.
func tapName(id string, n int) string {
	sum := sha256.Sum256([]byte(id))
	return "bc" + hex.EncodeToString(sum[:5]) + strconv.Itoa(n)
}

// NetlinkTaps is the Taps of the host, through netlink. A tap is persistent (it outlives the VMM
// that opens it, until Delete), single-queue with a virtio-net header, as cloud-hypervisor opens
// it with its default of one queue pair. With a VLAN, the bridge must have VLAN filtering on
// (ip link set BRIDGE type bridge vlan_filtering 1): the tap is then an access port of that VLAN
// alone (PVID, untagged). It needs CAP_NET_ADMIN.
type NetlinkTaps struct{}

// Ensure creates the tap if it is missing, makes it a port of its bridge with its VLAN and sets
// it up.
func (NetlinkTaps) Ensure(_ context.Context, t Tap) error {
	br, err := netlink.LinkByName(t.Bridge)
	if err != nil {
		return fmt.Errorf("chv: tap %s: bridge %q: %w", t.Name, t.Bridge, err)
	}
	bridge, ok := br.(*netlink.Bridge)
	if !ok {
		return fmt.Errorf("chv: tap %s: %q is a %s, not a bridge", t.Name, t.Bridge, br.Type())
	}
	link, err := netlink.LinkByName(t.Name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: t.Name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
		}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("chv: creating tap %s (needs CAP_NET_ADMIN): %w", t.Name, err)
		}
		link, err = netlink.LinkByName(t.Name)
	}
	if err != nil {
		return fmt.Errorf("chv: tap %s: %w", t.Name, err)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		return fmt.Errorf("chv: %s exists and is a %s, not a tap", t.Name, link.Type())
	}
	if link.Attrs().MasterIndex != bridge.Index {
		if err := netlink.LinkSetMaster(link, bridge); err != nil {
			return fmt.Errorf("chv: tap %s on bridge %s: %w", t.Name, t.Bridge, err)
		}
	}
	if t.VLAN > 0 {
		if err := accessPort(link, bridge, t.VLAN); err != nil {
			return fmt.Errorf("chv: tap %s on bridge %s: %w", t.Name, t.Bridge, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("chv: tap %s up: %w", t.Name, err)
	}
	return nil
}

// accessPort makes link a port of VLAN vid alone on bridge: untagged, its PVID.
func accessPort(link netlink.Link, bridge *netlink.Bridge, vid int) error {
	if vid > 4094 {
		return fmt.Errorf("VLAN %d is out of 1..4094", vid)
	}
	if bridge.VlanFiltering == nil || !*bridge.VlanFiltering {
		return fmt.Errorf("VLAN %d asked and the bridge has no VLAN filtering: turn it on "+
			"(ip link set %s type bridge vlan_filtering 1)", vid, bridge.Name)
	}
	vlans, err := netlink.BridgeVlanList()
	if err != nil {
		return fmt.Errorf("listing bridge VLANs: %w", err)
	}
	has := false
	for _, v := range vlans[int32(link.Attrs().Index)] {
		if int(v.Vid) == vid && v.PortVID() && v.EngressUntag() {
			has = true
			continue
		}
		if err := netlink.BridgeVlanDel(link, v.Vid, v.PortVID(), v.EngressUntag(), false, true); err != nil {
			return fmt.Errorf("removing VLAN %d: %w", v.Vid, err)
		}
	}
	if !has {
		if err := netlink.BridgeVlanAdd(link, uint16(vid), true, true, false, true); err != nil {
			return fmt.Errorf("adding VLAN %d: %w", vid, err)
		}
	}
	return nil
}

// Delete removes the tap; a missing one is not an error, a link of that name that is not a tap is.
func (NetlinkTaps) Delete(_ context.Context, name string) error {
	link, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("chv: tap %s: %w", name, err)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		return fmt.Errorf("chv: %s is a %s, not a tap: left alone", name, link.Type())
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("chv: deleting tap %s (needs CAP_NET_ADMIN): %w", name, err)
	}
	return nil
}
