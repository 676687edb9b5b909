//go:build linux

package hostnet_test

import (
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/vps/hostnet"
)

// namespace is a fresh network namespace for the rest of the test, and Links and a netlink
// handle in it. Outside root, or where namespaces cannot be made, the test skips, saying why.
func namespace(t *testing.T) (netns.NsHandle, *hostnet.Links, *netlink.Handle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("hostnet: making bridges needs root (CAP_NET_ADMIN) in a network namespace of its own; run the tests as root")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // unshare(CLONE_NEWNET) of this thread only
	if err != nil {
		runtime.UnlockOSThread()
		t.Skipf("hostnet: cannot make a network namespace here (%v)", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the test's namespace: %v", err) // the thread stays locked, and dies with the goroutine
	}
	runtime.UnlockOSThread()
	t.Cleanup(func() { ns.Close() }) // the last reference: the namespace and its links go
	l, err := hostnet.At(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return ns, l, h
}

func link(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l
}

func add(t *testing.T, h *netlink.Handle, l netlink.Link) {
	t.Helper()
	if err := h.LinkAdd(l); err != nil {
		if strings.Contains(err.Error(), "not supported") {
			t.Skipf("hostnet: this kernel cannot make a %s link (%v): it lacks the module", l.Type(), err)
		}
		t.Fatalf("add %s: %v", l.Attrs().Name, err)
	}
}

// veth adds a veth pair: dummy links need a module this kernel may lack; veth is everywhere.
func veth(t *testing.T, h *netlink.Handle, name, peer string) {
	t.Helper()
	add(t, h, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer})
}

// needVLAN skips a test where the kernel cannot make VLAN links (no 8021q module, as in some
// microVMs' kernels).
func needVLAN(t *testing.T, h *netlink.Handle) {
	t.Helper()
	veth(t, h, "probe0", "probe1")
	defer h.LinkDel(link(t, h, "probe0"))
	err := h.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "probe0.9", ParentIndex: link(t, h, "probe0").Attrs().Index}, VlanId: 9})
	if err != nil {
		t.Skipf("hostnet: this kernel cannot make VLAN links (%v): it lacks 802.1Q support (the 8021q module)", err)
	}
}

// TestEnsureMakesABridgeOnce makes an untagged segment's bridge in a fresh namespace, twice:
// the second time changes nothing. A link of the bridge's name that is no bridge, and a segment
// that is not valid, are refused, saying what is wrong.
func TestEnsureMakesABridgeOnce(t *testing.T) {
	t.Parallel()
	_, l, h := namespace(t)
	if err := l.Ensure(hostnet.Segment{Bridge: "br0"}); err != nil {
		t.Fatal(err)
	}
	br := link(t, h, "br0")
	if br.Type() != "bridge" || br.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("br0 is a %s link, flags %v: want a bridge, up", br.Type(), br.Attrs().Flags)
	}
	if err := l.Ensure(hostnet.Segment{Bridge: "br0"}); err != nil {
		t.Fatalf("ensured again: %v", err)
	}
	if b := link(t, h, "br0"); b.Attrs().Index != br.Attrs().Index {
		t.Fatalf("ensuring again made br0 anew (index %d, then %d)", br.Attrs().Index, b.Attrs().Index)
	}
	veth(t, h, "notbr", "notbr-peer")
	veth(t, h, "up0", "up0-peer")
	for _, c := range []struct {
		seg  hostnet.Segment
		want string
	}{
		{hostnet.Segment{Bridge: "notbr"}, "notbr exists and is a veth link, not a bridge"},
		{hostnet.Segment{Bridge: "br7", VLAN: 7, Uplink: "eth9"}, "the uplink eth9 is not an interface of this host"},
		{hostnet.Segment{Bridge: "br7", VLAN: 7}, "needs the host's uplink"},
		{hostnet.Segment{Bridge: "br7", VLAN: 4095, Uplink: "up0"}, "VLAN 4095 is out of range"},
		{hostnet.Segment{Bridge: "br7", VLAN: -1, Uplink: "up0"}, "VLAN -1 is out of range"},
		{hostnet.Segment{Bridge: "a-bridge-name-too-long"}, "is not an interface name"},
		{hostnet.Segment{Bridge: ""}, "is not an interface name"},
	} {
		if err := l.Ensure(c.seg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure(%+v) = %v, want an error saying %q", c.seg, err, c.want)
		}
	}
	if _, err := h.LinkByName("br7"); err == nil {
		t.Error("br7 was made by an Ensure that was refused: a refusal leaves the host as it was")
	}
}

// TestEnsureMakesAVLANSegmentOnce makes a bridge with the uplink's VLAN sub-interface as its
// port, in a fresh namespace, and again: the second time changes nothing (the same links, not
// made anew). What is in the way is refused, naming it: a link of the bridge's name that is no
// bridge, a sub-interface name taken by another VLAN, a bridge asked to carry a second VLAN.
func TestEnsureMakesAVLANSegmentOnce(t *testing.T) {
	t.Parallel()
	_, l, h := namespace(t)
	needVLAN(t, h)
	veth(t, h, "up0", "up0-peer")
	seg := hostnet.Segment{Bridge: "br100", VLAN: 100, Uplink: "up0"}
	if err := l.Ensure(seg); err != nil {
		t.Fatal(err)
	}
	br, v := link(t, h, "br100"), link(t, h, "up0.100")
	if br.Type() != "bridge" || br.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("br100 is a %s link, flags %v: want a bridge, up", br.Type(), br.Attrs().Flags)
	}
	vl, ok := v.(*netlink.Vlan)
	if !ok || vl.VlanId != 100 || vl.Attrs().ParentIndex != link(t, h, "up0").Attrs().Index {
		t.Fatalf("up0.100 is %#v: want VLAN 100 of up0", v)
	}
	if v.Attrs().MasterIndex != br.Attrs().Index || v.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("up0.100 has master %d and flags %v: want a port of br100 (%d), up", v.Attrs().MasterIndex, v.Attrs().Flags, br.Attrs().Index)
	}
	if up := link(t, h, "up0"); up.Attrs().Flags&net.FlagUp == 0 || up.Attrs().MasterIndex != 0 {
		t.Fatalf("the uplink has flags %v and master %d: want it up (its VLAN cannot be up otherwise), in no bridge", up.Attrs().Flags, up.Attrs().MasterIndex)
	}
	if err := l.Ensure(seg); err != nil {
		t.Fatalf("ensured again: %v", err)
	}
	if b2, v2 := link(t, h, "br100"), link(t, h, "up0.100"); b2.Attrs().Index != br.Attrs().Index || v2.Attrs().Index != v.Attrs().Index {
		t.Fatalf("ensuring again made the links anew: br100 %d→%d, up0.100 %d→%d", br.Attrs().Index, b2.Attrs().Index, v.Attrs().Index, v2.Attrs().Index)
	}

	add(t, h, &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "up0.300", ParentIndex: link(t, h, "up0").Attrs().Index}, VlanId: 301})
	for _, c := range []struct {
		seg  hostnet.Segment
		want string
	}{
		{hostnet.Segment{Bridge: "br300", VLAN: 300, Uplink: "up0"}, "up0.300 exists and is not VLAN 300 of up0"},
		{hostnet.Segment{Bridge: "br100", VLAN: 200, Uplink: "up0"}, "bridge br100 already carries VLAN 100 through up0.100"},
		{hostnet.Segment{Bridge: "br5", VLAN: 100, Uplink: "up0"}, "up0.100 is a port of another bridge"},
	} {
		if err := l.Ensure(c.seg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Ensure(%+v) = %v, want an error saying %q", c.seg, err, c.want)
		}
	}
	for _, name := range []string{"br300", "br5", "up0.200"} {
		if _, err := h.LinkByName(name); err == nil {
			t.Errorf("%s was made by an Ensure that was refused: a refusal leaves the host as it was", name)
		}
	}
	if got := hostnet.VLANName("enp129s0f1np1", 4094); got != "enp129s0f1.4094" {
		t.Errorf("VLANName = %q, want the uplink's name cut to fit 15 characters", got)
	}
}

// TestRemoveLeavesASegmentInUse: a VLAN segment goes (bridge and sub-interface) only once no
// instance's tap is plugged into its bridge, and removing it twice is no error; an untagged
// bridge is the host's and stays.
func TestRemoveLeavesASegmentInUse(t *testing.T) {
	t.Parallel()
	_, l, h := namespace(t)
	needVLAN(t, h)
	veth(t, h, "up0", "up0-peer")
	seg := hostnet.Segment{Bridge: "br42", VLAN: 42, Uplink: "up0"}
	if err := l.Ensure(seg); err != nil {
		t.Fatal(err)
	}
	veth(t, h, "tap0", "tap0-peer")
	if err := h.LinkSetMaster(link(t, h, "tap0"), link(t, h, "br42")); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.Remove(seg); err != nil || removed {
		t.Fatalf("Remove with a tap plugged in = %v, %v: want the segment left", removed, err)
	}
	link(t, h, "br42")
	link(t, h, "up0.42")
	if err := h.LinkDel(link(t, h, "tap0")); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.Remove(seg); err != nil || !removed {
		t.Fatalf("Remove of an unused segment = %v, %v", removed, err)
	}
	for _, name := range []string{"br42", "up0.42"} {
		if _, err := h.LinkByName(name); err == nil {
			t.Errorf("%s is still there", name)
		}
	}
	link(t, h, "up0") // the uplink is the host's
	if removed, err := l.Remove(seg); err != nil || removed {
		t.Fatalf("Remove of a removed segment = %v, %v", removed, err)
	}
	if err := l.Ensure(hostnet.Segment{Bridge: "br0"}); err != nil {
		t.Fatal(err)
	}
	if removed, err := l.Remove(hostnet.Segment{Bridge: "br0"}); err != nil || removed {
		t.Fatalf("Remove of an untagged segment = %v, %v", removed, err)
	}
	link(t, h, "br0")
}

// TestAGuestOnAVLANBridgeReachesTheVLAN sends a datagram from a "guest" (a namespace plugged
// into the VLAN bridge untagged, as an instance's tap is) across the host's uplink to a "switch"
// namespace, and checks that it arrived tagged: on the switch's VLAN 100 sub-interface.
func TestAGuestOnAVLANBridgeReachesTheVLAN(t *testing.T) {
	t.Parallel()
	_, l, h := namespace(t)
	needVLAN(t, h)
	guestNS, _, guest := namespace(t)
	switchNS, _, sw := namespace(t)
	// host up0 <-> switch sw0 (the wire), host tap0 <-> guest eth0 (the instance's NIC)
	add(t, h, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "sw0"})
	add(t, h, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}, PeerName: "eth0"})
	if err := h.LinkSetNsFd(link(t, h, "sw0"), int(switchNS)); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetNsFd(link(t, h, "eth0"), int(guestNS)); err != nil {
		t.Fatal(err)
	}
	if err := l.Ensure(hostnet.Segment{Bridge: "br100", VLAN: 100, Uplink: "up0"}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []error{
		h.LinkSetMaster(link(t, h, "tap0"), link(t, h, "br100")),
		h.LinkSetUp(link(t, h, "tap0")),
		h.LinkSetUp(link(t, h, "up0")),
		sw.LinkAdd(&netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "sw0.100", ParentIndex: link(t, sw, "sw0").Attrs().Index}, VlanId: 100}),
		sw.LinkSetUp(link(t, sw, "sw0")),
		sw.LinkSetUp(link(t, sw, "sw0.100")),
		sw.AddrAdd(link(t, sw, "sw0.100"), mustAddr(t, "10.99.0.2/24")),
		guest.LinkSetUp(link(t, guest, "eth0")),
		guest.AddrAdd(link(t, guest, "eth0"), mustAddr(t, "10.99.0.7/24")),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	vlanIndex := link(t, sw, "sw0.100").Attrs().Index

	var rx *net.UDPConn
	inNamespace(t, switchNS, func() error {
		var err error
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 4789})
		if err != nil {
			return err
		}
		raw, err := rx.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1) }); err != nil {
			return err
		}
		return serr
	})
	t.Cleanup(func() { rx.Close() })
	var tx *net.UDPConn
	inNamespace(t, guestNS, func() error {
		var err error
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 99, 0, 2), Port: 4789})
		return err
	})
	t.Cleanup(func() { tx.Close() })

	// The first datagrams may go before the bridge's ports are forwarding and ARP is done.
	got := make(chan int, 1)
	go func() {
		buf, oob := make([]byte, 64), make([]byte, 128)
		for {
			n, oobn, _, _, err := rx.ReadMsgUDP(buf, oob)
			if err != nil {
				close(got)
				return
			}
			if string(buf[:n]) == "hello vlan" {
				got <- arrivedOn(oob[:oobn])
				return
			}
		}
	}()
	deadline := time.After(20 * time.Second)
	for {
		if _, err := tx.Write([]byte("hello vlan")); err != nil && !strings.Contains(err.Error(), "refused") {
			t.Fatal(err)
		}
		select {
		case idx, ok := <-got:
			if !ok {
				t.Fatal("the switch's socket closed")
			}
			if idx != vlanIndex {
				t.Fatalf("the datagram arrived on interface %d, want sw0.100 (%d): it was not tagged with VLAN 100", idx, vlanIndex)
			}
			return
		case <-deadline:
			t.Fatal("no datagram from the guest reached the switch's VLAN 100 in 20 s")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func mustAddr(t *testing.T, s string) *netlink.Addr {
	a, err := netlink.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// inNamespace runs fn on a thread in ns; sockets it opens stay in ns. The thread is never
// unlocked, so it ends with its goroutine rather than carry ns to another.
func inNamespace(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// arrivedOn reads the interface index of an IP_PKTINFO control message.
func arrivedOn(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= int(unsafe.Sizeof(unix.Inet4Pktinfo{})) {
			return int((*unix.Inet4Pktinfo)(unsafe.Pointer(&m.Data[0])).Ifindex)
		}
	}
	return -1
}
