package ipmi_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/netpolicy"
)

// TestConnectionsGoThroughTheBMCsDial: with BMC.Dial set (the control plane's outbound policy)
// the session's UDP socket is the dial's, so a refused address gets no datagram.
func TestConnectionsGoThroughTheBMCsDial(t *testing.T) {
	t.Parallel()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var strict *netpolicy.Policy
	_, err = ipmi.Driver{}.State(context.Background(), power.BMC{Address: pc.LocalAddr().String(), Username: "admin", Password: "pw", Dial: strict.DialContext})
	var refused *netpolicy.RefusedError
	if !errors.As(err, &refused) {
		t.Errorf("a BMC on loopback under the default policy: %v, want refused", err)
	}
	_ = pc.SetReadDeadline(deadline())
	if n, _, err := pc.ReadFrom(make([]byte, 512)); err == nil {
		t.Errorf("the refused BMC got a datagram of %d bytes", n)
	}
}

func deadline() time.Time { return time.Now().Add(200 * time.Millisecond) }
