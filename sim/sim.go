// Package sim is the fleet simulator: N simulated nodes with fake hardware, each a real node
// agent that joins with a join token and holds a real session with a real gateway over mutual
// TLS, with knobs to inject XIDs, cut connections and make commands slow or failing.
//
// Start joins a fleet into a pool of a running control plane (its API's URL and a join token)
// and WaitConnected waits for the nodes' sessions; a Node's Hardware injects faults (InjectXID,
// SetPressure), and Disconnect and Resume cut and restore its connection. Modules' node sides run
// on every node (Options.Extensions). devserver, `better-compute sim` and the gateway benchmark
// use it.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/better-compute/compute/agent/ext"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// RefusedError is the control plane's refusal of what a simulated node sent (a report, a command's
// result): errors.As tells it apart from a connection that failed.
type RefusedError = nodeagent.RefusedError

// Options describe a simulated fleet.
type Options struct {
	URL     string // the control plane's API base URL, where JoinService is
	Token   string // a join token with enough uses for every node
	Gateway string // host:port; empty: what the join hands out
	// Transport is how the nodes reach the gateway: auto (""), grpc or websocket
	// (nodeagent.Config.Transport).
	Transport string
	Nodes     int
	GPUs      int    // per node; default 8
	Model     string // default "NVIDIA H100 80GB HBM3"
	Prefix    string // node names are <prefix>-<n>; default "sim"
	Parallel  int    // joins at once; default 16
	// MaxBackoff bounds each agent's wait between reconnects; default 2 s, for tests. A storm
	// of real agents is simulated with bcd's own, nodeagent's default of 30 s.
	MaxBackoff time.Duration
	Logger     *slog.Logger
	Version    string
	// Extensions carry out modules' command and desired-state kinds on every node.
	Extensions []ext.Extension
}

// Fleet is a running simulated fleet.
type Fleet struct {
	Nodes []*Node
}

// Node is one simulated node.
type Node struct {
	Name      string
	Hardware  *nodeagent.FakeHardware
	Store     *nodeagent.MemoryStore
	Converger *nodeagent.RecordingConverger
	// Reports is the node's queue of module reports: a test reports through it as an extension would.
	Reports *nodeagent.Reports
	agent   *nodeagent.Agent

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	parent context.Context
}

// Start joins the nodes and starts their agents. It returns once every node has joined (not yet
// necessarily connected: see WaitConnected).
func Start(ctx context.Context, o Options) (*Fleet, error) {
	if o.Nodes <= 0 {
		return nil, errors.New("sim: Nodes must be positive")
	}
	if o.GPUs == 0 {
		o.GPUs = 8
	}
	if o.Model == "" {
		o.Model = "NVIDIA H100 80GB HBM3"
	}
	if o.Prefix == "" {
		o.Prefix = "sim"
	}
	if o.Parallel == 0 {
		o.Parallel = 16
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := &Fleet{}
	client := &http.Client{Timeout: 30 * time.Second}
	sem := make(chan struct{}, o.Parallel)
	errs := make([]error, o.Nodes)
	var jwg sync.WaitGroup
	f.Nodes = make([]*Node, o.Nodes)
	for i := range o.Nodes {
		name := fmt.Sprintf("%s-%05d", o.Prefix, i)
		n := &Node{Name: name, Hardware: nodeagent.NewFakeHardware(name, o.GPUs, o.Model),
			Store: nodeagent.NewMemoryStore(), Converger: &nodeagent.RecordingConverger{}, Reports: nodeagent.NewReports(), parent: ctx}
		f.Nodes[i] = n
		jwg.Add(1)
		go func() {
			defer jwg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			facts := &agentv1.MachineFacts{Hostname: name, MachineId: "sim-" + name, Os: "linux", Arch: "amd64", AgentVersion: o.Version}
			id, err := nodeagent.Join(ctx, client, o.URL, o.Token, facts)
			if err == nil {
				err = n.Store.SetIdentity(id)
			}
			if err == nil {
				n.agent, err = nodeagent.New(nodeagent.Config{Store: n.Store, Hardware: n.Hardware, Converger: n.Converger,
					Logger: o.Logger.With("node", name), Version: o.Version, Facts: facts, Gateway: o.Gateway, Transport: o.Transport, MaxBackoff: o.MaxBackoff,
					Extensions: o.Extensions, Reports: n.Reports})
			}
			errs[i] = err
		}()
	}
	jwg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("sim: join: %w", err)
	}
	for _, n := range f.Nodes {
		n.Resume()
	}
	return f, nil
}

// Resume runs the node's agent (again).
func (n *Node) Resume() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(n.parent)
	n.cancel, n.done = cancel, make(chan struct{})
	done := n.done
	go func() {
		defer close(done)
		err := n.agent.Run(ctx)
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
	}()
}

// Disconnect stops the node's agent, as if the machine dropped off the network; Resume brings
// it back with everything its journal kept.
func (n *Node) Disconnect() {
	n.mu.Lock()
	cancel, done := n.cancel, n.done
	n.cancel = nil
	n.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Status is the node agent's status.
func (n *Node) Status() nodeagent.Status { return n.agent.Status() }

// Err is what the agent's last run returned (nil while running or after a clean stop).
func (n *Node) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// NodeID is the id the node joined as.
func (n *Node) NodeID() string {
	id, _, _ := n.Store.Identity()
	return id.NodeID
}

// WaitConnected waits until every node has a session, or ctx ends.
func (f *Fleet) WaitConnected(ctx context.Context) error {
	for {
		up := 0
		for _, n := range f.Nodes {
			if n.Status().Connected {
				up++
			}
		}
		if up == len(f.Nodes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sim: %d of %d nodes connected: %w", up, len(f.Nodes), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops every agent.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, n := range f.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.Disconnect() }()
	}
	wg.Wait()
}
