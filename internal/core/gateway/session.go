package gateway

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/core/pki"
)

// stream is what gRPC's and Connect's bidirectional streams have in common.
type stream interface {
	Send(*agentv1.ServerMessage) error
	Recv() (*agentv1.NodeMessage, error)
}

// session is one node's live session on this gateway.
type session struct {
	g        *Gateway
	node     string
	who      nodeInfo // the node's tenant, pool and role, as the session opened
	epoch    int64
	serial   string           // of the client certificate the session was opened with
	pub      crypto.PublicKey // that certificate's key, which signs the node's attested reports
	seq      int64            // the last attested report's place; only the reader touches it
	notAfter time.Time        // when that certificate expires, and the session with it
	told     atomic.Int64     // the heartbeat interval the node was last told, in nanoseconds
	out      chan *agentv1.ServerMessage
	kick     chan struct{}
	done     chan struct{}

	mu           sync.Mutex
	wantCommands bool
	wantDesired  bool
	resend       bool // the first dispatch of a session resends what was dispatched before
	sent         int64
	closed       bool
	tunnels      map[string]*Tunnel
}

func (s *session) wake(commands, desired bool) {
	s.mu.Lock()
	s.wantCommands = s.wantCommands || commands
	s.wantDesired = s.wantDesired || desired
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *session) interval() time.Duration { return time.Duration(s.told.Load()) }

func (s *session) sentGeneration() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// send queues a message for the writer; it gives up when the session ends.
func (s *session) send(ctx context.Context, m *agentv1.ServerMessage) bool {
	select {
	case s.out <- m:
		return true
	case <-s.done:
	case <-ctx.Done():
	}
	return false
}

// close ends the session, telling the node why.
func (s *session) close(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	select {
	case s.out <- &agentv1.ServerMessage{Body: &agentv1.ServerMessage_Goodbye{Goodbye: &agentv1.Goodbye{Reason: reason}}}:
	default:
	}
	close(s.done)
}

// ErrNotRunning is the error of a session that arrives while the gateway is not running.
var ErrNotRunning = errors.New("gateway: not running")

// ErrBusy is the error of a session refused because new sessions arrive faster than the gateway
// admits them.
var ErrBusy = errors.New("gateway: admitting no more new sessions this moment; retry with backoff")

// admit takes a token for a new session, or refuses it as unavailable, which nodes retry.
func (g *Gateway) admit() error {
	if !g.admission.Allow() {
		g.cfg.Metrics.Refused("session")
		return connect.NewError(connect.CodeUnavailable, ErrBusy)
	}
	return nil
}

// Serve runs a node's session on st until it ends: the node is the one cert names, which the TLS
// stack has verified against the machine CA. A revoked certificate is refused explicitly
// (permission denied, which the node takes as final), from memory: no query per connection.
func (g *Gateway) Serve(ctx context.Context, cert *x509.Certificate, st stream) error {
	g.mu.Lock()
	running := g.running
	g.mu.Unlock()
	if !running {
		return connect.NewError(connect.CodeUnavailable, ErrNotRunning)
	}
	if err := g.admit(); err != nil {
		return err
	}
	nodeID, err := g.revoked.CheckNode(cert)
	if err != nil {
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	if !time.Now().Before(cert.NotAfter) {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("the node's certificate has expired; join again"))
	}
	first, err := st.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("the first message of a session must be a hello"))
	}
	interval := g.HeartbeatInterval()
	who, epoch, err := g.claim(ctx, nodeID, pki.Role(cert), hello, g.grace(interval))
	if err != nil {
		return err
	}
	s := &session{g: g, node: nodeID, who: who, epoch: epoch, serial: pki.Serial(cert), pub: cert.PublicKey, notAfter: cert.NotAfter,
		out: make(chan *agentv1.ServerMessage, 64), kick: make(chan struct{}, 1), done: make(chan struct{}), resend: true, sent: -1}
	s.told.Store(int64(interval))
	g.mu.Lock()
	if old := g.sessions[nodeID]; old != nil {
		old.close("a newer connection of the same node arrived")
	}
	g.sessions[nodeID] = s
	g.mu.Unlock()
	// A revocation announced between the check above and now.
	if g.revoked.Revoked(s.serial) {
		s.close("the node's certificate was revoked")
	}
	// The session lasts no longer than the certificate it was opened with: a renewed one opens
	// the next.
	expiry := time.AfterFunc(time.Until(s.notAfter), func() { s.close("the node's certificate expired") })
	defer expiry.Stop()
	ended := false // the stream ended from the node's side, not by the gateway's decision
	defer func() {
		g.mu.Lock()
		if g.sessions[nodeID] == s {
			delete(g.sessions, nodeID)
		}
		// A node whose own stream ended is gone: the next flush takes it offline. A gateway
		// stopping lets its nodes reconnect elsewhere within their grace.
		if ended && g.running {
			g.closing[nodeID] = max(g.closing[nodeID], epoch)
		}
		g.mu.Unlock()
		s.close("session ended")
		s.endTunnels("the node's session ended")
	}()
	g.touch(nodeID, epoch, func(t *touch) { t.applied, t.ack = hello.GetAppliedGeneration(), true })

	// Two goroutines a session, besides the HTTP/2 server's own: this one writes to the stream
	// (what is queued on s.out, and the commands and desired state pushed when woken), and a
	// reader receives and handles the node's messages. Every goroutine costs a stack of about
	// 8 KiB at 10,000 sessions (docs/benchmarks.md, "Memory per session").
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { // the reader; it ends when the stream does, right after Serve returns
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if err := s.handle(ctx, m); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "gateway: node message", "node", nodeID, "error", err)
			}
		}
	}()
	if err := st.Send(&agentv1.ServerMessage{Body: &agentv1.ServerMessage_Welcome{Welcome: &agentv1.Welcome{
		NodeId: nodeID, Epoch: epoch, HeartbeatInterval: durationpb.New(interval)}}}); err != nil {
		ended = true
		return nil
	}
	s.wake(true, true)
	for {
		select {
		case m := <-s.out:
			if err := st.Send(m); err != nil {
				ended = true
				return nil
			}
		case <-s.kick:
			if err := s.push(ctx, st); err != nil {
				ended = true
				return nil
			}
		case err := <-recvErr:
			ended = true
			return err
		case <-s.done:
			// Send the goodbye, if one is queued, then stop.
			select {
			case m := <-s.out:
				_ = st.Send(m)
			default:
			}
			return nil
		case <-ctx.Done(): // the node went away
			ended = true
			return nil
		}
	}
}

// nodeInfo is what a session knows of its node.
type nodeInfo struct{ tenant, pool, role string }

// claim records this gateway as the session's holder at the next epoch, puts the node online and
// tells any other gateway that held it to let go. A certificate of another role than the node's
// (a node's certificate for a site agent, or the reverse) is refused.
func (g *Gateway) claim(ctx context.Context, nodeID, certRole string, hello *agentv1.Hello, grace time.Duration) (nodeInfo, int64, error) {
	var epoch int64
	var who nodeInfo
	err := g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var state, status string
		err := tx.QueryRow(ctx, `SELECT state, tenant_id, pool_id::text, role, status FROM compute.nodes WHERE id = $1 FOR NO KEY UPDATE`, nodeID).
			Scan(&state, &who.tenant, &who.pool, &who.role, &status)
		tenant := who.tenant
		if errors.Is(err, pgx.ErrNoRows) {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %s does not exist", nodeID))
		}
		if err != nil {
			return err
		}
		if state == api.NodeRetired {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %s is retired", nodeID))
		}
		if certRole != who.role {
			return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("node %s is a %s, and its certificate was issued for a %s", nodeID, who.role, certRole))
		}
		if epoch, err = nodes.OpenSession(ctx, tx, nodeID, g.cfg.ID, hello.GetAgentVersion(), grace); err != nil {
			return err
		}
		if status != api.NodeOnline {
			// A node that connects is healthy until its reports say otherwise.
			if err := fleet.Connect(ctx, tx, []string{nodeID}); err != nil {
				return err
			}
			if err := events.Emit(ctx, tx, "node.online", tenant, nodeID, map[string]any{"gateway": g.cfg.ID}); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, SessionsChannel, fmt.Sprintf("%s:%d", nodeID, epoch))
		return err
	})
	return who, epoch, err
}

// push sends what a wake asked for: the node's desired state if it moved, and its pending
// commands. An error of the database is logged and the wake kept for the next round; only a
// failed send (the stream is gone) is returned.
func (s *session) push(ctx context.Context, st stream) error {
	s.mu.Lock()
	commands, desired, resend := s.wantCommands, s.wantDesired, s.resend
	s.wantCommands, s.wantDesired = false, false
	if commands {
		s.resend = false
	}
	s.mu.Unlock()
	var msgs []*agentv1.ServerMessage
	if desired {
		m, err := s.pushDesired(ctx)
		if err != nil && ctx.Err() == nil {
			s.g.log.WarnContext(ctx, "gateway: desired state", "node", s.node, "error", err)
			s.rewake(false, true)
		}
		if m != nil {
			msgs = append(msgs, m)
		}
	}
	if commands {
		ms, err := s.pushCommands(ctx, resend)
		if err != nil && ctx.Err() == nil {
			s.g.log.WarnContext(ctx, "gateway: commands", "node", s.node, "error", err)
			s.rewake(true, false)
		}
		msgs = append(msgs, ms...)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// rewake tries a push again after a pause, so that a database in trouble is not asked again
// in a tight loop.
func (s *session) rewake(commands, desired bool) {
	time.AfterFunc(time.Second, func() { s.wake(commands, desired) })
}

// pushDesired is the node's desired state, if newer than what the session sent.
func (s *session) pushDesired(ctx context.Context) (*agentv1.ServerMessage, error) {
	ds, err := nodes.Desired(ctx, s.g.rt.DB.Pool, s.node, s.g.rt.Registry.DesiredKinds())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	stale := ds.Generation <= s.sent
	if !stale {
		s.sent = ds.Generation
	}
	s.mu.Unlock()
	if stale {
		return nil, nil
	}
	// A tunnel opened for a reservation ends with the reservation's hold on the node.
	held := map[string]bool{}
	for _, h := range ds.GetHolds() {
		held[h.GetHolder()] = true
	}
	s.endTunnelsOf(ctx, held)
	return &agentv1.ServerMessage{Body: &agentv1.ServerMessage_Desired{Desired: ds}}, nil
}

// pushCommands dispatches the node's pending commands (and, first in a session, resends those
// dispatched before).
func (s *session) pushCommands(ctx context.Context, resend bool) ([]*agentv1.ServerMessage, error) {
	cmds, err := nodes.Dispatch(ctx, s.g.rt.DB.Pool, s.node, resend)
	if err != nil {
		return nil, err
	}
	var msgs []*agentv1.ServerMessage
	for _, c := range cmds {
		var args map[string]any
		_ = json.Unmarshal(c.Args, &args)
		st, err := structpb.NewStruct(args)
		if err != nil {
			st = &structpb.Struct{}
		}
		var secret []byte
		if c.SealedSecret != nil {
			// Opened only here, on its way to the one node it is for, over its session.
			if secret, err = s.g.rt.Secrets.Open(nodes.SecretPurpose(c.ID), c.SealedSecret); err != nil {
				return msgs, fmt.Errorf("open the secret of command %s: %w", c.ID, err)
			}
		}
		msgs = append(msgs, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_Command{Command: &agentv1.Command{
			Id: c.ID, Kind: c.Kind, Args: st, Deadline: timestamppb.New(c.Deadline), Secret: secret}}})
	}
	return msgs, nil
}

// handle takes one message from the node. None of it calls IAM.
func (s *session) handle(ctx context.Context, m *agentv1.NodeMessage) error {
	g := s.g
	switch b := m.Body.(type) {
	case *agentv1.NodeMessage_Heartbeat:
		// Every heartbeat is answered with the interval to beat at from now on (it moves with the
		// number of sessions held); the grace the flush writes is derived from it.
		interval := g.HeartbeatInterval()
		s.told.Store(int64(interval))
		// Host pressure is written by the flush too, the last heartbeat's winning: no statement
		// per heartbeat.
		g.touch(s.node, s.epoch, func(t *touch) {
			t.applied, t.ack = max(t.applied, b.Heartbeat.GetAppliedGeneration()), true
			if p := b.Heartbeat.GetPressure(); p != nil {
				t.health = pressureHealth(p)
			}
		})
		s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_HeartbeatAck{HeartbeatAck: &agentv1.HeartbeatAck{
			HeartbeatInterval: durationpb.New(interval)}}})
	case *agentv1.NodeMessage_Attested:
		g.touch(s.node, s.epoch, nil)
		body, why := s.verify(b.Attested)
		if why != "" {
			return s.refuseReport(ctx, why, "attested")
		}
		switch r := body.Report.(type) {
		case *agentv1.AttestedBody_Inventory:
			if s.who.role != api.RoleNode {
				return nil // a site agent offers no capacity: its machine's hardware is not the pool's
			}
			return g.inventory(ctx, s.node, r.Inventory)
		case *agentv1.AttestedBody_Result:
			return s.result(ctx, r.Result, b.Attested)
		}
		return s.refuseReport(ctx, "an attested report with nothing in it", "attested")
	case *agentv1.NodeMessage_Inventory, *agentv1.NodeMessage_Result:
		// Results and inventories are taken signed only (Attested).
		return s.refuseReport(ctx, "unsigned", fmt.Sprintf("%T", m.Body))
	case *agentv1.NodeMessage_Health:
		g.touch(s.node, s.epoch, nil)
		if s.who.role != api.RoleNode {
			return nil
		}
		return g.health(ctx, s.node, b.Health)
	case *agentv1.NodeMessage_TunnelOutput:
		if t := s.tunnel(b.TunnelOutput.GetId()); t != nil {
			t.output(b.TunnelOutput)
		}
	case *agentv1.NodeMessage_TunnelAck:
		if t := s.tunnel(b.TunnelAck.GetId()); t != nil {
			t.credited(b.TunnelAck.GetBytes())
		}
	case *agentv1.NodeMessage_TunnelExit:
		if t := s.tunnel(b.TunnelExit.GetId()); t != nil {
			t.finish(b.TunnelExit)
			s.forget(t.ID)
		}
	case *agentv1.NodeMessage_Report:
		g.touch(s.node, s.epoch, nil)
		return s.report(ctx, b.Report)
	case *agentv1.NodeMessage_Ack:
		g.touch(s.node, s.epoch, func(t *touch) {
			t.applied, t.errText, t.ack, t.acked = max(t.applied, b.Ack.GetGeneration()), b.Ack.GetError(), true, true
		})

	case *agentv1.NodeMessage_Renew:
		return s.renew(ctx, b.Renew.GetCsrDer())
	case *agentv1.NodeMessage_Hello:
		return errors.New("a second hello in one session")
	}
	return nil
}

// errRenewRefused is a renewal of a certificate that is revoked or expired, or whose node is
// retired.
var errRenewRefused = errors.New("renewal refused")

// renew issues a new certificate to a session whose own is still good: checked in the database,
// not only in memory, under the node's row lock, which revocations (retire, a rejoin takeover)
// take too, so that a renewal cannot slip past a revocation running at once.
func (s *session) renew(ctx context.Context, csrDER []byte) error {
	g := s.g
	if g.revoked.Revoked(s.serial) {
		s.close("the node's certificate was revoked")
		return nil
	}
	auth, err := g.mod.Authority()
	if err != nil {
		return err
	}
	var der []byte
	var notAfter time.Time
	err = g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var state string
		var revoked bool
		err := tx.QueryRow(ctx, `SELECT n.state, c.revoked_at IS NOT NULL OR c.not_after <= now()
			FROM compute.nodes n JOIN compute.certificates c ON c.subject = n.id::text AND c.kind = 'node'
			WHERE n.id = $1 AND c.serial = $2 FOR SHARE OF n`, s.node, s.serial).Scan(&state, &revoked)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && (revoked || state == api.NodeRetired) {
			return errRenewRefused
		}
		if err != nil {
			return err
		}
		der, notAfter, err = auth.IssueNode(ctx, tx, s.node, s.who.role, csrDER, g.mod.CertLifetime())
		return err
	})
	if errors.Is(err, errRenewRefused) {
		s.close("the node's certificate was revoked or has expired; no renewal")
		return nil
	}
	if err != nil {
		return err
	}
	s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_Renewed{Renewed: &agentv1.Renewed{
		CertificateDer: der, NotAfter: timestamppb.New(notAfter)}}})
	return nil
}
