package gateway_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/sim"
)

// transportFleet joins n simulated nodes that reach the gateway at gw over transport.
func (p *plane) transportFleet(t *testing.T, n int, prefix, gw, transport string) *sim.Fleet {
	t.Helper()
	f, err := sim.Start(p.ctx, sim.Options{URL: p.url, Token: p.token(t, n), Gateway: gw, Transport: transport, Nodes: n, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return f
}

func waitConnected(t *testing.T, f *sim.Fleet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSessionsOverTheWebSocket: behind a middlebox that lets only HTTP/1.1 through, a node in
// auto mode opens its session over the WebSocket and lives there as over gRPC (inventory,
// desired state, commands, its refusal for good); a node held to gRPC does not get through; a
// node held to the WebSocket connects directly too.
func TestSessionsOverTheWebSocket(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	mb := computetest.BlockHTTP2(t, p.gw)

	f := p.transportFleet(t, 1, "auto", mb.Addr, nodeagent.TransportAuto)
	waitConnected(t, f)
	node := f.Nodes[0]
	if st := node.Status(); st.Transport != nodeagent.TransportWebSocket {
		t.Fatalf("the auto node's session is over %q", st.Transport)
	}
	if mb.Refused() == 0 || mb.Passed() == 0 {
		t.Fatalf("the middlebox refused %d and passed %d connections", mb.Refused(), mb.Passed())
	}
	computetest.Eventually(t, patience, "the node's 8 GPUs", func() bool {
		devs, err := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: node.NodeID()})
		return err == nil && len(devs) == 8
	})
	r, err := p.Compute.API.Reservations.Create(p.ctx, p.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the hold on the node", func() bool {
		return len(node.Converger.Last().GetHolds()) == 1 && node.Converger.Last().GetHolds()[0].GetHolder() == r.ID
	})
	computetest.Eventually(t, patience, "the applied generation recorded", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_desired WHERE node_id = $1 AND applied_generation = generation AND generation > 1`, node.NodeID()) == 1
	})
	cmd, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the command's result", func() bool {
		c, err := p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	// A reconnect keeps to the WebSocket (it opened after gRPC could not): no new refusal.
	refused := mb.Refused()
	node.Disconnect()
	node.Resume()
	computetest.Eventually(t, patience, "a second session", func() bool { return node.Status().Sessions == 2 })
	if st := node.Status(); st.Transport != nodeagent.TransportWebSocket || mb.Refused() != refused {
		t.Fatalf("after a reconnect: %+v, %d refusals more", st, mb.Refused()-refused)
	}

	// Held to gRPC, a node does not get through the middlebox.
	grpcOnly := p.transportFleet(t, 1, "grpc", mb.Addr, nodeagent.TransportGRPC)
	before := mb.Refused()
	computetest.Eventually(t, patience, "the gRPC node refused twice", func() bool { return mb.Refused() >= before+2 })
	if st := grpcOnly.Nodes[0].Status(); st.Connected || st.LastError == "" {
		t.Fatalf("a node held to gRPC behind the middlebox: %+v", st)
	}

	// Held to the WebSocket, a node connects to the gateway directly.
	ws := p.transportFleet(t, 1, "ws", p.gw, nodeagent.TransportWebSocket)
	waitConnected(t, ws)
	if st := ws.Nodes[0].Status(); st.Transport != nodeagent.TransportWebSocket {
		t.Fatalf("the websocket node's session is over %q", st.Transport)
	}

	// A refusal for good travels as over gRPC (close status 4007, permission denied): the
	// retired node's agent stops.
	if _, err := p.Compute.API.Reservations.Release(p.ctx, p.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Compute.API.Nodes.Drain(p.ctx, p.RootKey, api.DrainNode{NodeRef: api.NodeRef{Node: node.NodeID()}, End: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Compute.API.Nodes.Retire(p.ctx, p.RootKey, api.RetireNode{NodeRef: api.NodeRef{Node: node.NodeID()}}); err != nil {
		t.Fatal(err)
	}
	node.Disconnect()
	node.Resume()
	computetest.Eventually(t, patience, "the retired node's agent stopped for good", func() bool { return errors.Is(node.Err(), nodeagent.ErrRetired) })
}
