package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/compute"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/postgres/pgtest"
	"github.com/better-compute/compute/sim"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// plane is a control plane with its API and a gateway on loopback.
type plane struct {
	*computetest.Env
	url, gw string
	stop    func()
	ctx     context.Context
}

func fast(o *compute.Options) {
	o.HeartbeatInterval = 200 * time.Millisecond
}

func newPlane(t *testing.T, configure func(*compute.Options)) *plane {
	t.Helper()
	if configure == nil {
		configure = fast
	}
	env := computetest.New(t, computetest.Options{Configure: configure})
	p := &plane{Env: env, ctx: context.Background()}
	p.url = env.Server(t)
	p.gw, p.stop = env.Gateway(t, "")
	if _, err := env.Compute.API.Pools.Create(p.ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *plane) token(t *testing.T, uses int) string {
	t.Helper()
	jt, err := p.Compute.API.JoinTokens.Create(p.ctx, p.RootKey, api.CreateJoinToken{Pool: "h100", MaxUses: uses})
	if err != nil {
		t.Fatal(err)
	}
	return jt.Token
}

func (p *plane) fleet(t *testing.T, n int, prefix, gw string) *sim.Fleet {
	t.Helper()
	return p.fleetWith(t, p.token(t, n), n, prefix, gw)
}

// fleetWith is fleet with a join token the test made.
func (p *plane) fleetWith(t *testing.T, token string, n int, prefix, gw string) *sim.Fleet {
	t.Helper()
	f, err := sim.Start(p.ctx, sim.Options{URL: p.url, Token: token, Gateway: gw, Nodes: n, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

// patience bounds the waits on what the control plane does by itself: generous for a loaded
// machine, and never reached when it works.
const patience = 30 * time.Second

func TestJoinSessionInventoryAndDesiredState(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 2, "gpu", p.gw)
	// The nodes are online, their GPUs are devices and atoms.
	computetest.Eventually(t, patience, "16 GPUs in the pool", func() bool {
		s, err := p.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return err == nil && s.Schedulable == 2 && len(s.Models) == 1 && s.Models[0].Total == 16
	})
	nodes, err := p.Compute.API.Nodes.List(p.ctx, p.RootKey, api.ListNodes{Pool: "h100"})
	if err != nil || len(nodes.Items) != 2 || nodes.Items[0].Status != api.NodeOnline {
		t.Fatalf("nodes = %+v, %v", nodes, err)
	}
	devs, err := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: f.Nodes[0].NodeID()})
	if err != nil || len(devs) != 8 || devs[0].UUID != "GPU-fake-gpu-00000-0" {
		t.Fatalf("devices = %+v, %v", devs, err)
	}
	// A reservation reaches the node as desired state, and its release takes it away.
	r, err := p.Compute.API.Reservations.Create(p.ctx, p.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	holder := map[string]*sim.Node{f.Nodes[0].NodeID(): f.Nodes[0], f.Nodes[1].NodeID(): f.Nodes[1]}[r.Allocations[0].NodeID]
	computetest.Eventually(t, patience, "the hold on the node", func() bool {
		last := holder.Converger.Last()
		return last != nil && len(last.GetHolds()) == 1 && last.GetHolds()[0].GetHolder() == r.ID && len(last.GetHolds()[0].GetGpus()) == 8
	})
	computetest.Eventually(t, patience, "the applied generation recorded", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_desired WHERE node_id = $1 AND applied_generation = generation AND generation > 1`, holder.NodeID()) == 1
	})
	if _, err := p.Compute.API.Reservations.Release(p.ctx, p.RootKey, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the hold removed", func() bool {
		last := holder.Converger.Last()
		return last != nil && len(last.GetHolds()) == 0
	})
}

func TestBadJoinsAreRefusedAndCreateNothing(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	client := agentv1connect.NewJoinServiceClient(http.DefaultClient, p.url)
	_, csr, err := nodeagent.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	single := p.token(t, 1)
	revoked, err := p.Compute.API.JoinTokens.Create(p.ctx, p.RootKey, api.CreateJoinToken{Pool: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Compute.API.JoinTokens.Revoke(p.ctx, p.RootKey, api.RevokeJoinToken{Token: revoked.ID}); err != nil {
		t.Fatal(err)
	}
	expired, err := p.Compute.API.JoinTokens.Create(p.ctx, p.RootKey, api.CreateJoinToken{Pool: "h100", TTL: "1s"})
	if err != nil {
		t.Fatal(err)
	}
	p.DB.SetNow(time.Now().Add(time.Hour))
	defer p.DB.ResetNow()
	join := func(token string, csr []byte, host string) error {
		_, err := client.Join(p.ctx, connect.NewRequest(&agentv1.JoinRequest{Token: token, CsrDer: csr,
			Facts: &agentv1.MachineFacts{Hostname: host, MachineId: "machine-" + token}}))
		return err
	}
	if err := join(single, csr, "first"); err != nil {
		t.Fatalf("a good join: %v", err)
	}
	// An RSA key is not accepted; a CSR that is not a CSR is not either.
	bad := []byte("not a csr")
	key, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	p224, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	cases := []struct {
		name, token string
		csr         []byte
		host        string
		code        connect.Code
	}{
		{"reused single-use token", single, csr, "second", connect.CodeUnauthenticated},
		{"revoked token", revoked.Token, csr, "third", connect.CodeUnauthenticated},
		{"expired token", expired.Token, csr, "fourth", connect.CodeUnauthenticated},
		{"malformed token", "hunter2", csr, "fifth", connect.CodeUnauthenticated},
		{"no token", "", csr, "sixth", connect.CodeInvalidArgument},
		{"bad CSR", p.token(t, 1), bad, "seventh", connect.CodeInvalidArgument},
		{"a weak curve", p.token(t, 1), p224, "eighth", connect.CodeInvalidArgument},
		{"a bad hostname", p.token(t, 1), csr, "no spaces allowed", connect.CodeInvalidArgument},
		{"a name taken by another machine", p.token(t, 1), csr, "first", connect.CodeAlreadyExists},
	}
	for _, tc := range cases {
		err := join(tc.token, tc.csr, tc.host)
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != tc.code || ce.Message() == "" {
			t.Errorf("%s: %v, want %v with a message", tc.name, err, tc.code)
		}
	}
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.nodes`); n != 1 {
		t.Fatalf("%d nodes exist after one good join and refused ones", n)
	}
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.join_tokens WHERE uses_left < max_uses`); n != 1 {
		t.Fatalf("refused joins spent %d tokens", n-1)
	}
}

func TestCommandsRoundTripWithoutIAM(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	// Counted from before the node joins: its join, inventory and heartbeats ask IAM nothing.
	token := p.token(t, 1)
	p.Counter.Reset()
	f := p.fleetWith(t, token, 1, "cmd", p.gw)
	node := f.Nodes[0]
	computetest.Eventually(t, patience, "the inventory's 8 GPUs and a heartbeat flush written", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.devices WHERE node_id = $1`, node.NodeID()) == 8 &&
			computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_sessions WHERE node_id = $1 AND last_seen_at > connected_at`, node.NodeID()) == 1
	})
	cmd, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	done := func(id string) api.Command {
		var c api.Command
		computetest.Eventually(t, patience, "command "+id+" finished", func() bool {
			c, err = p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: id})
			return err == nil && c.FinishedAt != nil
		})
		return c
	}
	got := done(cmd.ID)
	if got.State != api.CommandSucceeded || got.Attempts != 1 {
		t.Fatalf("health.check = %+v", got)
	}
	var out map[string]any
	if err := json.Unmarshal(got.Result, &out); err != nil || out["gpus"] != float64(8) {
		t.Fatalf("result %s, %v", got.Result, err)
	}
	// The result is an event too, written with it.
	evs, err := events.About(p.ctx, p.DB.Pool, cmd.ID)
	if err != nil || len(evs) != 2 || evs[1].Type != "command.finished" || evs[1].Data["state"] != api.CommandSucceeded || evs[1].Data["kind"] != api.CommandHealthCheck {
		t.Fatalf("events of the command: %+v, %v; want command.created, then command.finished succeeded", evs, err)
	}
	// Heartbeats, the inventory, the dispatch and the result asked IAM nothing: the only
	// questions were the API calls' own (create, then the reads of the test).
	for _, d := range p.Counter.Decisions() {
		if d.Action != "compute:commands:create" && d.Action != "compute:commands:get" {
			t.Fatalf("a fleet path asked IAM: %+v", d)
		}
	}
	creates := 0
	for _, d := range p.Counter.Decisions() {
		if d.Action == "compute:commands:create" {
			creates++
		}
	}
	if creates != 1 {
		t.Fatalf("%d decisions for one commands.create", creates)
	}

	// A reset of a held GPU is refused unless forced; forced, the node does it.
	r, err := p.Compute.API.Reservations.Create(p.ctx, p.RootKey, api.CreateReservation{Pool: "h100", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the hold on the node", func() bool { return len(node.Converger.Last().GetHolds()) == 1 })
	_, err = p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandGPUReset, Args: json.RawMessage(`{"gpu": 3}`)})
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("reset of a held GPU = %v, want failed_precondition", err)
	}
	forced, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandGPUReset, Args: json.RawMessage(`{"gpu": 3, "force": true}`)})
	if err != nil {
		t.Fatal(err)
	}
	if c := done(forced.ID); c.State != api.CommandSucceeded || node.Hardware.Resets(3) != 1 {
		t.Fatalf("forced reset = %+v, resets %d", c, node.Hardware.Resets(3))
	}
	_ = r

	// A failing command fails with the node's error; a slow one fails its deadline, not lost.
	node.Hardware.FailCommands(errors.New("dcgm not installed"))
	fail, _ := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandDiagRun})
	if c := done(fail.ID); c.State != api.CommandFailed || c.Error != "dcgm not installed" {
		t.Fatalf("failing command = %+v", c)
	}
	node.Hardware.FailCommands(nil)
	node.Hardware.SlowCommands(time.Hour)
	slow, _ := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandHealthCheck, Deadline: "1s"})
	if c := done(slow.ID); c.State != api.CommandFailed {
		t.Fatalf("slow command = %+v, want failed past its deadline", c)
	}
}

func TestReconnectAfterGatewayRestartAndOffline(t *testing.T) {
	// Not parallel: it listens again on the port it freed, which a test beside it could take.
	p := newPlane(t, nil)
	f := p.fleet(t, 2, "rs", p.gw)
	epoch := computetest.Count(t, p.DB.Pool, `SELECT max(epoch) FROM compute.node_sessions`)
	// The gateway goes away; a new control plane process takes its port.
	p.stop()
	other := computetest.Attach(t, p.Env, computetest.Options{Configure: fast})
	other.Gateway(t, p.gw)
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "sessions held by the new gateway at a newer epoch", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_sessions WHERE epoch > $1`, epoch) == 2
	})
	// A command reaches a node through the new gateway.
	cmd, err := other.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: f.Nodes[1].NodeID()}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the command's result", func() bool {
		c, err := other.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	// A node that drops off goes offline after its grace period, and placement skips it.
	f.Nodes[0].Disconnect()
	computetest.Eventually(t, patience, "the node offline", func() bool {
		n, err := other.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: f.Nodes[0].NodeID()})
		return err == nil && n.Status == api.NodeOffline
	})
	s, err := other.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
	if err != nil || s.Schedulable != 1 {
		t.Fatalf("summary with a node offline = %+v, %v", s, err)
	}
	f.Nodes[0].Resume()
	computetest.Eventually(t, patience, "the node online again", func() bool {
		n, _ := other.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: f.Nodes[0].NodeID()})
		return n.Status == api.NodeOnline
	})
}

func TestTwoGatewaysRouteCommandsToTheOwner(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	second := computetest.Attach(t, p.Env, computetest.Options{Configure: fast})
	gw2, _ := second.Gateway(t, "")
	a := p.fleet(t, 1, "on-gw1", p.gw)
	b := p.fleet(t, 1, "on-gw2", gw2)
	// Created through the first control plane, for a node held by the second's gateway.
	cmd, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: b.Nodes[0].NodeID()}, Kind: api.CommandDiagRun})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the result from the second gateway's node", func() bool {
		c, err := p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(DISTINCT gateway_id) FROM compute.node_sessions`); n != 2 {
		t.Fatalf("sessions are held by %d gateways, want 2", n)
	}
	_ = a
}

func TestCertificateRenewalAndRevocation(t *testing.T) {
	t.Parallel()
	p := newPlane(t, func(o *compute.Options) {
		fast(o)
		o.NodeCertLifetime = 4 * time.Minute // past half of its life at once: certificates start 5 minutes early
	})
	f := p.fleet(t, 1, "cert", p.gw)
	node := f.Nodes[0]
	first, _, _ := node.Store.Identity()
	computetest.Eventually(t, patience, "a renewed certificate", func() bool {
		id, _, _ := node.Store.Identity()
		return string(id.CertDER) != string(first.CertDER)
	})
	// The new certificate works: a new session with it.
	node.Disconnect()
	node.Resume()
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	// Retiring the node revokes its certificates: the next handshake is refused, for good.
	if _, err := p.Compute.API.Nodes.Drain(p.ctx, p.RootKey, api.DrainNode{NodeRef: api.NodeRef{Node: node.NodeID()}, End: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Compute.API.Nodes.Retire(p.ctx, p.RootKey, api.RetireNode{NodeRef: api.NodeRef{Node: node.NodeID()}}); err != nil {
		t.Fatal(err)
	}
	node.Disconnect()
	node.Resume()
	computetest.Eventually(t, 15*time.Second, "the agent refused for good after its node was retired", func() bool {
		return errors.Is(node.Err(), nodeagent.ErrRetired)
	})
}

// TestXIDMakesAGPUUnhealthy: a critical XID makes the GPU unhealthy, out of placement. (Its
// remediation, which resets it, is TestACriticalXIDIsRemediated's: here the node's commands fail,
// so the GPU stays as the XID left it.)
func TestXIDMakesAGPUUnhealthy(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "xid", p.gw)
	computetest.Eventually(t, patience, "8 GPUs", func() bool {
		s, _ := p.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return len(s.Models) == 1 && s.Models[0].Total == 8
	})
	f.Nodes[0].Hardware.FailCommands(errors.New("the test keeps the GPU broken"))
	f.Nodes[0].Hardware.InjectXID(5, 79) // fallen off the bus
	computetest.Eventually(t, patience, "GPU 5 unhealthy", func() bool {
		devs, _ := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: f.Nodes[0].NodeID()})
		return len(devs) == 8 && devs[5].Health == api.HealthUnhealthy
	})
	computetest.Eventually(t, patience, "the node's remediation failing with the reset", func() bool {
		page, _ := p.Compute.API.Workflows.List(p.ctx, p.RootKey, api.ListWorkflows{Subject: f.Nodes[0].NodeID(), State: api.WorkflowFailed})
		return len(page.Items) == 1
	})
	devs, _ := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: f.Nodes[0].NodeID()})
	if devs[5].Health != api.HealthUnhealthy {
		t.Fatalf("GPU 5 after Xid 79 and a failed reset: %+v", devs[5])
	}
}

// TestGatewayServicesOnAHostGRPCServer serves sessions from the host's own grpc.Server instead of
// NodeHandler.
func TestGatewayServicesOnAHostGRPCServer(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Configure: fast})
	ctx := context.Background()
	url := env.Server(t)
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Compute.GatewayTLS(ctx, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	env.Compute.GatewayServices(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = env.Compute.Stop(ctx); srv.Stop() })
	if _, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	p := &plane{Env: env, url: url, gw: ln.Addr().String(), ctx: ctx}
	f := p.fleet(t, 1, "grpc", p.gw)
	cmd, err := env.Compute.API.Commands.Create(ctx, env.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: f.Nodes[0].NodeID()}, Kind: api.CommandInventoryRefresh})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the result over the host's grpc.Server", func() bool {
		c, err := env.Compute.API.Commands.Get(ctx, env.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
}
