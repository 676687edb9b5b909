package gateway_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/nodes"
)

// remediation waits for the remediation run of node to leave running, and returns it.
func (p *plane) remediation(t *testing.T, node string, after string) api.WorkflowRun {
	t.Helper()
	var run api.WorkflowRun
	defer func() {
		if t.Failed() {
			t.Logf("the last remediation run seen: %+v", run)
		}
	}()
	computetest.Eventually(t, 60*time.Second, "a finished remediation of node "+node, func() bool {
		page, err := p.Compute.API.Workflows.List(p.ctx, p.RootKey, api.ListWorkflows{Workflow: nodes.XIDRemediation, Subject: node})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 0 && page.Items[0].ID != after {
			run = page.Items[0]
			return run.State != api.WorkflowRunning
		}
		return false
	})
	return run
}

// TestACriticalXIDIsRemediated injects an XID that needs a reset into a GPU a reservation holds:
// the node is cordoned, the remediation waits for the holder, resets the GPU through a command to
// the node, sees it healthy and uncordons the node. A second XID whose reset fails leaves the
// node cordoned and the run failed: the escalation.
func TestACriticalXIDIsRemediated(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "rem", p.gw)
	node := f.Nodes[0].NodeID()
	computetest.Eventually(t, patience, "8 GPUs", func() bool {
		s, _ := p.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return len(s.Models) == 1 && s.Models[0].Total == 8
	})
	r, err := p.Compute.API.Reservations.Create(p.ctx, p.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	f.Nodes[0].Hardware.InjectXID(5, 79) // fallen off the bus

	// The drain waits for the reservation, saying so.
	var seen api.WorkflowRun
	computetest.Eventually(t, 15*time.Second, "the drain step waiting for the holder", func() bool {
		page, err := p.Compute.API.Workflows.List(p.ctx, p.RootKey, api.ListWorkflows{Workflow: nodes.XIDRemediation, Subject: node})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 0 {
			seen = page.Items[0]
		}
		return seen.Step == "drain" && strings.Contains(seen.Steps[1].Note, "held by reservation "+r.ID)
	})
	n, err := p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node})
	if err != nil || n.State != api.NodeCordoned {
		t.Fatalf("while remediating the node is %s (%v), want cordoned", n.State, err)
	}
	if _, err := p.Compute.API.Reservations.Release(p.ctx, p.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	run := p.remediation(t, node, "")
	if run.State != api.WorkflowSucceeded {
		t.Fatalf("remediation = %+v, want succeeded", run)
	}
	devs, _ := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: node})
	n, _ = p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node})
	if devs[5].Health != api.HealthHealthy || n.State != api.NodeActive {
		t.Fatalf("after remediation GPU 5 is %s and the node %s, want healthy and active", devs[5].Health, n.State)
	}
	cmds, err := p.Compute.API.Commands.List(p.ctx, p.RootKey, api.ListCommands{Node: node})
	if err != nil || len(cmds.Items) != 1 || cmds.Items[0].Kind != api.CommandGPUReset || cmds.Items[0].State != api.CommandSucceeded {
		t.Fatalf("commands = %+v, %v: want one gpu.reset, succeeded", cmds.Items, err)
	}
	var types []string
	computetest.Eventually(t, patience, "the node.active event", func() bool {
		page, err := p.Compute.API.Events.List(p.ctx, p.RootKey, api.ListEvents{Subject: node, PageRequest: api.PageRequest{Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		types = types[:0]
		for _, e := range page.Items {
			if e.Type != "node.online" && e.Type != "node.joined" {
				types = append(types, e.Type)
			}
		}
		return slices.Contains(types, "node.active")
	})
	if want := []string{"gpu.health", "node.cordoned", "node.active"}; !slices.Equal(types, want) {
		t.Errorf("the node's events %v, want %v", types, want)
	}

	// A reset that fails escalates: the run fails, the node stays cordoned.
	f.Nodes[0].Hardware.FailCommands(errors.New("the GPU does not answer"))
	f.Nodes[0].Hardware.InjectXID(2, 48) // double-bit ECC
	failed := p.remediation(t, node, run.ID)
	if failed.State != api.WorkflowFailed || failed.Step != "verify" || !strings.Contains(failed.Error, "does not answer") {
		t.Fatalf("a failed reset's remediation = %+v", failed)
	}
	if n, _ = p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node}); n.State != api.NodeCordoned {
		t.Errorf("after a failed remediation the node is %s, want cordoned for an operator", n.State)
	}
}
