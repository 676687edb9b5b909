package chv

import (
	"context"
	"errors"
	"net"
	"os"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/vps/runtime"
)

// inFreshNetns moves the test's goroutine, for the rest of the test, into a network namespace
// of its own: its thread is locked and never unlocked, so the thread ends with the test and the
// host's network is never touched. Processes it starts (the fake VMMs) are in the namespace too.
// It skips, saying why, where namespaces cannot be made.
func inFreshNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace of its own, with a bridge and tap devices")
	}
	goruntime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		t.Skipf("cannot make a network namespace here: %v", err)
	}
}

func addBridge(t *testing.T, name string, vlanFiltering bool) *netlink.Bridge {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if vlanFiltering {
		br.VlanFiltering = &vlanFiltering
	}
	err := netlink.LinkAdd(br)
	if vlanFiltering && errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("this kernel's bridges have no VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): %v", err)
	}
	if err != nil {
		t.Fatalf("bridge %s: %v", name, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	return br
}

// getTap is the tap device name.
func getTap(t *testing.T, name string) *netlink.Tuntap {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("tap %s: %v", name, err)
	}
	tap, ok := l.(*netlink.Tuntap)
	if !ok {
		t.Fatalf("%s is a %s", name, l.Type())
	}
	return tap
}

// portVLANs are the VLANs of a bridge port: vid → "pvid untagged" etc.
func portVLANs(t *testing.T, link netlink.Link) map[uint16]string {
	t.Helper()
	all, err := netlink.BridgeVlanList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16]string{}
	for _, v := range all[int32(link.Attrs().Index)] {
		var flags []string
		if v.PortVID() {
			flags = append(flags, "pvid")
		}
		if v.EngressUntag() {
			flags = append(flags, "untagged")
		}
		out[v.Vid] = strings.Join(flags, " ")
	}
	return out
}

// TestNetlinkTaps makes, moves and removes real tap devices in a network namespace of the
// test's own: a persistent single-queue tap with a virtio-net header (as cloud-hypervisor opens
// it), up, on its bridge; every call converges; a link that is not a tap is never taken for one.
func TestNetlinkTaps(t *testing.T) {
	t.Parallel()
	inFreshNetns(t)
	ctx := context.Background()
	var taps NetlinkTaps
	br0 := addBridge(t, "br0", false)
	br1 := addBridge(t, "br1", false)

	if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br0"}); err != nil {
		t.Fatal(err)
	}
	tap := getTap(t, "bctap0")
	if tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Flags&netlink.TUNTAP_VNET_HDR == 0 || tap.Flags&netlink.TUNTAP_NO_PI == 0 ||
		tap.Flags&netlink.TUNTAP_MULTI_QUEUE != 0 || tap.NonPersist {
		t.Fatalf("tap: mode %v, flags %#x, non-persistent %v; want a persistent single-queue tap with a vnet header", tap.Mode, tap.Flags, tap.NonPersist)
	}
	if tap.MasterIndex != br0.Index || tap.Attrs().RawFlags&unix.IFF_UP == 0 {
		t.Fatalf("tap: master %d (br0 is %d), raw flags %#x; want up on br0", tap.MasterIndex, br0.Index, tap.Attrs().RawFlags)
	}
	index := tap.Index
	if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br0"}); err != nil || getTap(t, "bctap0").Index != index {
		t.Fatalf("Ensure again: %v; the tap was made again: %v", err, getTap(t, "bctap0").Index != index)
	}
	if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br1"}); err != nil {
		t.Fatal(err)
	}
	if tap := getTap(t, "bctap0"); tap.MasterIndex != br1.Index || tap.Index != index {
		t.Fatalf("the tap moved to br1: master %d, index %d", tap.MasterIndex, tap.Index)
	}
	if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br0", VLAN: 7}); err == nil || !strings.Contains(err.Error(), "has no VLAN filtering: turn it on") {
		t.Fatalf("a VLAN on a bridge without filtering: %v", err)
	}

	// Links that are not what they are asked to be.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bcveth0"}, PeerName: "bcveth1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tap  Tap
		want string
	}{
		{Tap{Name: "bcveth0", Bridge: "br0"}, "bcveth0 exists and is a veth, not a tap"},
		{Tap{Name: "bctap1", Bridge: "nobr"}, `bridge "nobr"`},
		{Tap{Name: "bctap1", Bridge: "bcveth0"}, `"bcveth0" is a veth, not a bridge`},
	} {
		if err := taps.Ensure(ctx, c.tap); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure(%+v): %v; want %q", c.tap, err, c.want)
		}
	}
	if err := taps.Delete(ctx, "bcveth0"); err == nil || !strings.Contains(err.Error(), "is a veth, not a tap: left alone") {
		t.Fatalf("Delete of a veth: %v", err)
	}
	if _, err := netlink.LinkByName("bcveth0"); err != nil {
		t.Fatalf("the veth was removed: %v", err)
	}

	for range 2 {
		if err := taps.Delete(ctx, "bctap0"); err != nil {
			t.Fatal(err)
		}
	}
	var nf netlink.LinkNotFoundError
	if _, err := netlink.LinkByName("bctap0"); !errors.As(err, &nf) {
		t.Fatalf("the tap after Delete: %v", err)
	}
}

// TestNetlinkTapsOnVLANs: on a bridge with VLAN filtering a tap is an access port of its VLAN
// alone (the bridge's default VLAN 1 removed), and follows a change of VLAN.
func TestNetlinkTapsOnVLANs(t *testing.T) {
	t.Parallel()
	inFreshNetns(t)
	ctx := context.Background()
	var taps NetlinkTaps
	addBridge(t, "br1", true)
	for _, vid := range []int{7, 7, 9} {
		if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br1", VLAN: vid}); err != nil {
			t.Fatal(err)
		}
		if got := portVLANs(t, getTap(t, "bctap0")); len(got) != 1 || got[uint16(vid)] != "pvid untagged" {
			t.Fatalf("the tap's VLANs = %v; want only %d, pvid untagged", got, vid)
		}
	}
	if err := taps.Ensure(ctx, Tap{Name: "bctap0", Bridge: "br1", VLAN: 4095}); err == nil || !strings.Contains(err.Error(), "VLAN 4095 is out of 1..4094") {
		t.Fatalf("VLAN 4095: %v", err)
	}
	if err := taps.Delete(ctx, "bctap0"); err != nil {
		t.Fatal(err)
	}
}

// TestRuntimeWithNetlinkTaps runs an instance with real taps in a network namespace of the
// test's own: the fake VMM, in the namespace too, checks at boot that each NIC's tap is there
// and up, as cloud-hypervisor opens it; a tap that went (a host reboot) is made again at the
// next boot; Delete removes them.
func TestRuntimeWithNetlinkTaps(t *testing.T) {
	t.Parallel()
	inFreshNetns(t)
	br := addBridge(t, "br0", false)
	h := newHarness(t, func(o *Options) { o.Taps = NetlinkTaps{} })
	h.fakeTaps()
	in := h.instance("a")
	in.NICs = []runtime.NIC{{MAC: "52:54:00:00:00:01", Bridge: "br0"}, {Bridge: "br0"}}
	h.ensure(in, runtime.StateRunning)
	for i := range in.NICs {
		if tap := getTap(t, tapName("a", i)); tap.MasterIndex != br.Index {
			t.Fatalf("NIC %d's tap is not on br0", i)
		}
	}
	// A host reboot removes the taps; the next boot makes them again.
	in.Power = runtime.PowerStopped
	h.ensure(in, runtime.StateStopped)
	if err := (NetlinkTaps{}).Delete(context.Background(), tapName("a", 1)); err != nil {
		t.Fatal(err)
	}
	in.Power = runtime.PowerRunning
	h.ensure(in, runtime.StateRunning)

	if err := h.r.Delete(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	for i := range in.NICs {
		if _, err := net.InterfaceByName(tapName("a", i)); err == nil {
			t.Fatalf("tap %s is left after Delete", tapName("a", i))
		}
	}
}
