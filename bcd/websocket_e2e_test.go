package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestBCDFallsBackToTheWebSocket: a real bcd whose only way to the gateway is a middlebox that
// closes every connection offering HTTP/2 (computetest.BlockHTTP2) comes online over the
// WebSocket fallback, gets its desired state and runs a command, with nothing configured.
func TestBCDFallsBackToTheWebSocket(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{})
	ctx := context.Background()
	a, bin := e.API, e.Bin
	mb := computetest.BlockHTTP2(t, e.Gateway)
	n := e.node(nodeOptions{Name: "behind-a-proxy", Gateway: mb.Addr})
	state, cdiDir := n.State, n.CDI
	nodeID := e.online("behind-a-proxy")
	waitStatus(t, bin, state, "a session over the WebSocket", func(st status) bool { return st.Connected && st.Transport == "websocket" })
	if mb.Refused() == 0 {
		t.Fatal("the middlebox refused no HTTP/2 connection: gRPC was not tried first")
	}
	if out, _ := exec.Command(bin, "status", "--state-dir", state).Output(); !strings.Contains(string(out), "over websocket") {
		t.Fatalf("bcd status:\n%s", out)
	}

	// Desired state: a reservation's CDI spec.
	r, err := a.Reservations.Create(ctx, e.RootKey, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the CDI spec of the reservation", func() bool {
		b, err := os.ReadFile(filepath.Join(cdiDir, "better-compute-"+r.ID+".json"))
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID)
	})
	// A command round trip.
	cmd, err := a.Commands.Create(ctx, e.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the health check's result", func() bool {
		c, err := a.Commands.Get(ctx, e.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})

	// bcd doctor, with the node stopped, dials the gateway itself: through the middlebox only
	// HTTP/1.1 gets through, which is a warning (sessions use the fallback), or a failure for a
	// node held to gRPC.
	n.kill()
	for transport, want := range map[string]string{"auto": "warn", "grpc": "fail"} {
		out, _ := exec.Command(bin, "doctor", "--json", "--state-dir", state, "--cdi-dir", cdiDir, "--gateway", mb.Addr,
			"--transport", transport, "--config", writeFakeConfig(t)).Output()
		var report struct {
			Checks []struct{ Name, Status, Detail string }
		}
		if err := json.Unmarshal(out, &report); err != nil {
			t.Fatalf("doctor --transport %s: %v\n%s", transport, err, out)
		}
		for _, c := range report.Checks {
			if c.Name == "gateway" && c.Status != want {
				t.Errorf("doctor --transport %s: the gateway check is %s (want %s): %s", transport, c.Status, want, c.Detail)
			}
		}
	}
}
