package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestBCDFallsBackToTheWebSocket: a real bcd whose only way to the gateway is a middlebox that
// closes every connection offering HTTP/2 (computetest.BlockHTTP2) comes online over the
// WebSocket fallback, gets its desired state and runs a command, with nothing configured.
func TestBCDFallsBackToTheWebSocket(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the bcd binary")
	}
	bin := buildBCD(t)
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 300 * time.Millisecond }})
	ctx := context.Background()
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	mb := computetest.BlockHTTP2(t, gw)
	a := env.Compute.API
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	tok, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	state, cdiDir := t.TempDir(), t.TempDir()
	if out, err := exec.Command(bin, "join", "--state-dir", state, "--url", url, "--token", tok.Token, "--hostname", "behind-a-proxy").CombinedOutput(); err != nil {
		t.Fatalf("join: %v\n%s", err, out)
	}
	n := startNode(t, bin, "--state-dir", state, "--cdi-dir", cdiDir, "--gateway", mb.Addr, "--fake-gpus", "8", "--log-level", "warn")

	var nodeID string
	eventually(t, "the node online with 8 GPUs", func() bool {
		list, err := a.Nodes.List(ctx, env.RootKey, api.ListNodes{Pool: "h100"})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status != api.NodeOnline {
			return false
		}
		nodeID = list.Items[0].ID
		devs, err := a.Devices.List(ctx, env.RootKey, api.ListDevices{Node: nodeID})
		return err == nil && len(devs) == 8
	})
	var st struct {
		Connected bool   `json:"connected"`
		Transport string `json:"transport"`
	}
	eventually(t, "bcd status to show a session over the WebSocket", func() bool {
		out, err := exec.Command(bin, "status", "--json", "--state-dir", state).Output()
		return err == nil && json.Unmarshal(out, &st) == nil && st.Connected && st.Transport == "websocket"
	})
	if mb.Refused() == 0 {
		t.Fatal("the middlebox refused no HTTP/2 connection: gRPC was not tried first")
	}
	if out, _ := exec.Command(bin, "status", "--state-dir", state).Output(); !strings.Contains(string(out), "over websocket") {
		t.Fatalf("bcd status:\n%s", out)
	}

	// Desired state: a reservation's CDI spec.
	r, err := a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the CDI spec of the reservation", func() bool {
		b, err := os.ReadFile(filepath.Join(cdiDir, "better-compute-"+r.ID+".json"))
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID)
	})
	// A command round trip.
	cmd, err := a.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: nodeID}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the health check's result", func() bool {
		c, err := a.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: cmd.ID})
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
