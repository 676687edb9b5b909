package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
	"github.com/better-compute/compute/internal/core/gateway"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// rawNode is a node joined through JoinService whose session the test drives by hand.
type rawNode struct {
	id    string
	epoch int64 // the session's, from its welcome
	st    grpc.BidiStreamingClient[agentv1.NodeMessage, agentv1.ServerMessage]
	conn  *grpc.ClientConn
}

func (p *plane) rawSession(t *testing.T, host string) *rawNode {
	t.Helper()
	id, tc := p.rawJoin(t, host)
	return p.rawConnect(t, id, tc, p.gw)
}

// rawJoin joins a node and returns its id and the TLS configuration of its sessions.
func (p *plane) rawJoin(t *testing.T, host string) (string, *tls.Config) {
	t.Helper()
	keyDER, csr, err := nodeagent.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := agentv1connect.NewJoinServiceClient(http.DefaultClient, p.url).Join(p.ctx, connect.NewRequest(&agentv1.JoinRequest{
		Token: p.token(t, 1), CsrDer: csr, Facts: &agentv1.MachineFacts{Hostname: host, MachineId: "machine-" + host}}))
	if err != nil {
		t.Fatal(err)
	}
	key, _ := x509.ParsePKCS8PrivateKey(keyDER)
	roots := x509.NewCertPool()
	for _, der := range resp.Msg.GetCaCertificatesDer() {
		c, _ := x509.ParseCertificate(der)
		roots.AddCert(c)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots,
		Certificates: []tls.Certificate{{Certificate: [][]byte{resp.Msg.GetCertificateDer()}, PrivateKey: key}}}
	return resp.Msg.GetNodeId(), tc
}

// rawConnect opens a session of the node id at the gateway gw.
func (p *plane) rawConnect(t *testing.T, id string, tc *tls.Config, gw string) *rawNode {
	t.Helper()
	conn, err := grpc.NewClient(gw, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// The gateway starts with the control plane's background work, asynchronously: a session
	// that comes first is told it is not running, and a node tries again, as bcd does.
	var n *rawNode
	computetest.Eventually(t, 10*time.Second, "a session the gateway runs", func() bool {
		ctx, cancel := context.WithCancel(p.ctx)
		t.Cleanup(cancel)
		st, err := agentv1.NewSessionServiceClient(conn).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A stream the gateway already ended (not running yet) fails the send with io.EOF: its
		// status is what the receive answers.
		if err := st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "test"}}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		first, err := st.Recv()
		if err != nil && strings.Contains(err.Error(), gateway.ErrNotRunning.Error()) {
			cancel()
			return false
		}
		if err != nil || first.GetWelcome() == nil {
			t.Fatalf("first message %v, %v; want a welcome", first, err)
		}
		n = &rawNode{id: id, epoch: first.GetWelcome().GetEpoch(), st: st, conn: conn}
		return true
	})
	return n
}

// next returns the next message for which keep holds, skipping the others.
func (n *rawNode) next(t *testing.T, keep func(*agentv1.ServerMessage) bool) (*agentv1.ServerMessage, error) {
	t.Helper()
	var goodbye string
	for {
		m, err := n.st.Recv()
		if err != nil && goodbye != "" {
			return nil, fmt.Errorf("%w, after the gateway's goodbye: %s", err, goodbye)
		}
		if err != nil {
			return nil, err
		}
		if g := m.GetGoodbye(); g != nil {
			goodbye = g.GetReason()
		}
		if keep(m) {
			return m, nil
		}
	}
}

func (n *rawNode) heartbeat(t *testing.T) {
	t.Helper()
	if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
}

// TestHeartbeatRepliesCarryTheInterval: every heartbeat is answered with the interval to beat at,
// the node's grace follows from it, and the agent beats at what it was told.
func TestHeartbeatRepliesCarryTheInterval(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	n := p.rawSession(t, "raw-beat")
	for range 3 {
		n.heartbeat(t)
		m, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetHeartbeatAck() != nil })
		if err != nil {
			t.Fatal(err)
		}
		if got := m.GetHeartbeatAck().GetHeartbeatInterval().AsDuration(); got != 200*time.Millisecond {
			t.Fatalf("heartbeat reply interval = %v, want the gateway's 200ms", got)
		}
	}
	// Grace is three intervals the node was told and two flushes.
	computetest.Eventually(t, patience, "the session's grace from its interval", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_sessions WHERE node_id = $1
			AND offline_after - last_seen_at = interval '2.6 seconds'`, n.id) == 1
	})
	f := p.fleet(t, 1, "follow", p.gw)
	computetest.Eventually(t, patience, "the agent following the told interval", func() bool {
		return f.Nodes[0].Status().HeartbeatInterval == 200*time.Millisecond
	})
}

// TestOfflineNodeComesBackOnlineWhenHeartbeatsResume: a node marked offline while its session
// lived (an agent stopped for a while, then continued) is online and schedulable again at its
// next heartbeat.
func TestOfflineNodeComesBackOnlineWhenHeartbeatsResume(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "stopped", p.gw)
	node := f.Nodes[0].NodeID()
	computetest.Eventually(t, patience, "the node schedulable", func() bool {
		s, err := p.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return err == nil && s.Schedulable == 1
	})
	sessions := f.Nodes[0].Status().Sessions
	// What the worker does to a node silent past its grace.
	computetest.Eventually(t, patience, "the node marked offline", func() bool {
		if _, err := p.DB.Pool.Exec(p.ctx, `UPDATE compute.node_sessions SET offline_after = now() - interval '1 second' WHERE node_id = $1`, node); err != nil {
			t.Fatal(err)
		}
		// MarkOffline and the heartbeat flush take the nodes' rows in one order: neither may lose
		// a deadlock to the other.
		if _, err := nodes.MarkOffline(p.ctx, p.DB); err != nil {
			t.Fatalf("MarkOffline: %v", err)
		}
		n, err := p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node})
		return err == nil && n.Status == api.NodeOffline
	})
	computetest.Eventually(t, patience, "the node online and schedulable again", func() bool {
		n, err := p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node})
		s, serr := p.Compute.API.Capacity.Summary(p.ctx, p.RootKey, api.SummarizeCapacity{Pool: "h100"})
		return err == nil && serr == nil && n.Status == api.NodeOnline && s.Schedulable == 1
	})
	if got := f.Nodes[0].Status().Sessions; got != sessions {
		t.Fatalf("the node came back by reconnecting (%d sessions, was %d), not by its heartbeats", got, sessions)
	}
}

// TestHandshakeFailureIsRetried: a gateway that refuses the node's certificate at the TLS
// handshake (an overloaded one, a misconfigured one) is not the control plane retiring the node.
func TestHandshakeFailureIsRetried(t *testing.T) {
	// Not parallel: it listens again on the port it freed, which a test beside it could take.
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "hs", p.gw)
	node := f.Nodes[0]
	cfg, err := p.Compute.GatewayTLS(p.ctx, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	p.stop()
	node.Disconnect()
	// A server the node trusts whose check of the client certificate fails (a revocation query
	// that timed out under load, as before): the alert is bad_certificate.
	refusing := cfg.Clone()
	refusing.VerifyConnection = func(tls.ConnectionState) error { return errors.New("revocation check timed out") }
	var ln net.Listener
	computetest.Eventually(t, 5*time.Second, "the stopped gateway's port free to listen on again", func() bool {
		ln, err = net.Listen("tcp", p.gw)
		return err == nil
	})
	tln := tls.NewListener(ln, refusing)
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	node.Resume()
	// Several attempts. A refused handshake reaches the agent as the server's bad_certificate
	// alert or, when the server has closed first, as a broken pipe: the alert must be among them.
	// Under load the broken pipes may come first for a while: it looks for up to 15 s.
	seen := map[string]bool{}
	defer func() {
		if t.Failed() {
			t.Logf("the agent's errors seen: %v", seen)
		}
	}()
	computetest.Eventually(t, 15*time.Second, "an attempt failed with the case at hand (bad certificate)", func() bool {
		e := node.Status().LastError
		seen[e] = true
		return strings.Contains(e, "bad certificate")
	})
	if err := node.Err(); err != nil {
		t.Fatalf("the agent gave up after a refused handshake: %v", err)
	}
	ln.Close()
	other := computetest.Attach(t, p.Env, computetest.Options{Configure: fast})
	other.Gateway(t, p.gw)
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatalf("the node did not come back once the gateway accepted it: %v (last error %s)", err, node.Status().LastError)
	}
}

// TestRevocationEndsTheOpenSession: retiring a node closes the session it has open, and the
// node is then refused for good.
func TestRevocationEndsTheOpenSession(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "rev", p.gw)
	node := f.Nodes[0]
	if _, err := p.Compute.API.Nodes.Retire(p.ctx, p.RootKey, api.RetireNode{NodeRef: api.NodeRef{Node: node.NodeID()}}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the agent refused for good", func() bool { return errors.Is(node.Err(), nodeagent.ErrRetired) })
}

// TestRenewalOfARevokedCertificateIsRefused: a session whose certificate was revoked (here
// behind the gateway's back, as if the notification were lost) gets no new certificate.
func TestRenewalOfARevokedCertificateIsRefused(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	n := p.rawSession(t, "raw-renew")
	if _, err := p.DB.Pool.Exec(p.ctx, `UPDATE compute.certificates SET revoked_at = now() WHERE kind = 'node' AND subject = $1`, n.id); err != nil {
		t.Fatal(err)
	}
	_, csr, _ := nodeagent.NewKey()
	if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Renew{Renew: &agentv1.RenewRequest{CsrDer: csr}}}); err != nil {
		t.Fatal(err)
	}
	m, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetRenewed() != nil || m.GetGoodbye() != nil })
	if err == nil && m.GetRenewed() != nil {
		t.Fatal("a revoked certificate was renewed")
	}
	if k := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.certificates WHERE kind = 'node' AND subject = $1 AND revoked_at IS NULL`, n.id); k != 0 {
		t.Fatalf("%d unrevoked certificates for a revoked node", k)
	}
}

// TestListenIsReestablished: the gateway's LISTEN connection, killed as by a database restart,
// comes back.
func TestListenIsReestablished(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	listeners := func() []int {
		rows, err := p.DB.Pool.Query(p.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var pids []int
		for rows.Next() {
			var pid int
			_ = rows.Scan(&pid)
			pids = append(pids, pid)
		}
		return pids
	}
	computetest.Eventually(t, patience, "a listening connection", func() bool { return len(listeners()) == 1 })
	old := listeners()[0]
	if _, err := p.DB.Pool.Exec(p.ctx, `SELECT pg_terminate_backend($1)`, old); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "a new listening connection", func() bool {
		l := listeners()
		return len(l) == 1 && l[0] != old
	})
	// And it works: a command reaches its node by notification.
	f := p.fleet(t, 1, "listen", p.gw)
	cmd, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: f.Nodes[0].NodeID()}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the command's result", func() bool {
		c, err := p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
}

// TestJoinBodiesAreCapped: JoinService, which anyone may call, reads no large request.
func TestJoinBodiesAreCapped(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	big := bytes.Repeat([]byte{'x'}, 8<<20)
	_, err := agentv1connect.NewJoinServiceClient(http.DefaultClient, p.url).Join(p.ctx, connect.NewRequest(&agentv1.JoinRequest{
		Token: "bc_jt_nothing", CsrDer: big}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("an 8 MiB join = %v, want resource_exhausted", err)
	}
}

// TestSessionEndsWithItsCertificate: a session lasts no longer than the client certificate it
// was opened with (a node renews, and opens the next session with the new one).
func TestSessionEndsWithItsCertificate(t *testing.T) {
	t.Parallel()
	p := newPlane(t, func(o *compute.Options) {
		fast(o)
		o.NodeCertLifetime = 3 * time.Second
	})
	// A first session waits for the gateway to run: the one under test must not spend its
	// certificate's seconds on being told the gateway is not running yet.
	p.rawSession(t, "raw-warmup")
	n := p.rawSession(t, "raw-expiry")
	m, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetGoodbye() != nil })
	if err != nil {
		t.Fatalf("the session ended without a goodbye: %v", err)
	}
	if !strings.Contains(m.GetGoodbye().GetReason(), "expired") {
		t.Fatalf("goodbye %q, want the certificate's expiry", m.GetGoodbye().GetReason())
	}
}
