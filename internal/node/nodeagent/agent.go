package nodeagent

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os/exec"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/compute/agent/ext"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/lib/attest"
)

// Config configures an agent.
type Config struct {
	Store     Store
	Hardware  Hardware
	Converger Converger
	Logger    *slog.Logger
	Version   string
	Facts     *agentv1.MachineFacts
	// Gateway overrides the gateway addresses of the identity (host:port).
	Gateway string
	// Transport is how sessions reach the gateway: TransportAuto (""), TransportGRPC or
	// TransportWebSocket (see dial for auto's rule).
	Transport string
	// MaxBackoff bounds the wait between reconnects; default 30s.
	MaxBackoff time.Duration
	// Extensions carry out the command and desired-state kinds of modules (agent/ext).
	Extensions []ext.Extension
	// Reports, if set, is the queue of module reports the sessions send (NewReports).
	Reports *Reports
	// Exec lets holders' tunnels run commands on this machine (access.exec); off, they are
	// refused. Consoles are the consoles access.console may attach to, by name ("" is the
	// node's own): Unix sockets, a serial console's (QEMU's -serial unix:…, a console server).
	Exec     bool
	Consoles map[string]string
	// Confine runs the commands of holders of part of the node, each as its reservation's own
	// user (bcd/internal/tenancy). Nil: only a holder of the whole node, or an operator, may
	// run commands here; the others are refused.
	Confine Confiner
}

// Confiner confines a holder's command to its reservation: its own unprivileged user, cgroup,
// home and devices.
type Confiner interface {
	// Confine sets cmd up to run confined to reservation, or says why it cannot. started is
	// called once the command started (or failed to), to release what it held for the start.
	Confine(reservation string, cmd *exec.Cmd) (started func(), err error)
}

// Agent runs a node's session, reconnecting until stopped.
type Agent struct {
	cfg  Config
	exts *ext.Set

	mu     sync.Mutex
	status Status
	// wsUntil: in auto mode, until when reconnects try the WebSocket first (dial).
	wsUntil time.Time
}

// Status is what `bcd status` shows.
type Status struct {
	NodeID            string    `json:"nodeId"`
	NodeName          string    `json:"nodeName"`
	Connected         bool      `json:"connected"`
	Gateway           string    `json:"gateway,omitempty"`
	Transport         string    `json:"transport,omitempty"` // of the session: grpc or websocket
	Epoch             int64     `json:"epoch,omitempty"`
	AppliedGeneration int64     `json:"appliedGeneration"`
	Holds             int       `json:"holds"`
	PendingResults    int       `json:"pendingResults"`
	CertNotAfter      time.Time `json:"certNotAfter"`
	LastError         string    `json:"lastError,omitempty"`
	Sessions          int       `json:"sessions"` // sessions opened since start
	// HeartbeatInterval is what the gateway last told the node to beat at.
	HeartbeatInterval time.Duration `json:"heartbeatInterval,omitempty"`
}

// New returns an agent; Run runs it.
func New(cfg Config) (*Agent, error) {
	if cfg.Store == nil || cfg.Hardware == nil {
		return nil, errors.New("nodeagent: a store and hardware are required")
	}
	if cfg.Converger == nil {
		cfg.Converger = &RecordingConverger{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if !ValidTransport(cfg.Transport) {
		return nil, fmt.Errorf("nodeagent: unknown transport %q: auto, grpc or websocket", cfg.Transport)
	}
	exts, err := ext.NewSet(cfg.Extensions...)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	return &Agent{cfg: cfg, exts: exts}, nil
}

// Status returns the agent's state.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

func (a *Agent) setStatus(f func(*Status)) {
	a.mu.Lock()
	f(&a.status)
	a.mu.Unlock()
}

// Run keeps a session up until ctx ends, reconnecting with jittered exponential backoff. It
// returns an error only for what reconnecting cannot cure: no identity, or a node the control
// plane has retired.
func (a *Agent) Run(ctx context.Context) error {
	backoff := 500 * time.Millisecond
	for ctx.Err() == nil {
		id, ok, err := a.cfg.Store.Identity()
		if err != nil {
			return fmt.Errorf("nodeagent: read identity: %w", err)
		}
		if !ok {
			return errors.New("nodeagent: the node has not joined: run bcd join first")
		}
		start := time.Now()
		err = a.session(ctx, id)
		if ctx.Err() != nil {
			return nil
		}
		a.setStatus(func(s *Status) { s.Connected, s.LastError = false, errString(err) })
		if permanent(err) {
			return err
		}
		if time.Since(start) > time.Minute {
			backoff = 500 * time.Millisecond // it was up a while: start over
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		a.cfg.Logger.Info("nodeagent: session ended; reconnecting", "error", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, a.cfg.MaxBackoff)
	}
	return nil
}

// ErrRetired is returned by Run when the control plane refuses the node for good.
var ErrRetired = errors.New("nodeagent: the control plane refuses this node (retired, or its certificate revoked)")

func permanent(err error) bool { return errors.Is(err, ErrRetired) }

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// tlsConfig is the client side of mutual TLS: the node's certificate, the machine CA as the only
// root, TLS 1.3.
func tlsConfig(id Identity) (*tls.Config, error) {
	key, err := x509.ParsePKCS8PrivateKey(id.KeyDER)
	if err != nil {
		return nil, fmt.Errorf("nodeagent: the node's key: %w", err)
	}
	pool := x509.NewCertPool()
	for _, der := range id.CADER {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("nodeagent: the CA certificate: %w", err)
		}
		pool.AddCert(c)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		RootCAs:      pool,
		Certificates: []tls.Certificate{{Certificate: [][]byte{id.CertDER}, PrivateKey: key}},
	}, nil
}

// session runs one connection's session, over gRPC or its WebSocket fallback (dial).
func (a *Agent) session(ctx context.Context, id Identity) error {
	addr := a.cfg.Gateway
	if addr == "" && len(id.Gateways) > 0 {
		addr = id.Gateways[rand.N(len(id.Gateways))]
	}
	if addr == "" {
		return errors.New("nodeagent: no gateway address: the join gave none; pass --gateway")
	}
	tc, err := tlsConfig(id)
	if err != nil {
		return err
	}
	key, err := x509.ParsePKCS8PrivateKey(id.KeyDER)
	if err != nil {
		return fmt.Errorf("nodeagent: the node's key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return fmt.Errorf("nodeagent: the node's key is a %T, which cannot sign", key)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, transport, err := a.dial(ctx, addr, tc)
	if err != nil {
		return classify(err)
	}
	defer st.close()
	s := &nodeSession{a: a, id: id, st: st, transport: transport, cancel: cancel, key: signer}
	return s.run(ctx, addr)
}

// nodeSession is one live session, node side.
type nodeSession struct {
	a      *Agent
	id     Identity
	st     stream
	cancel context.CancelFunc
	// transport is what carries the session: TransportGRPC or TransportWebSocket.
	transport string

	sendMu sync.Mutex
	wg     sync.WaitGroup
	// key is the key of the session's certificate, which signs its attested reports; epoch and
	// seq bind them to the session and order them (under sendMu).
	key   crypto.Signer
	epoch int64
	seq   int64

	mu       sync.Mutex
	applied  int64
	holds    *agentv1.DesiredState
	renewal  []byte        // the key of a renewal in flight
	interval time.Duration // the heartbeat interval the gateway last asked for
	tunnels  map[string]*tunnel
}

func (s *nodeSession) send(m *agentv1.NodeMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.st.Send(m)
}

// sendAttested signs a result or an inventory for this session and sends it: numbered, signed
// and sent under one lock, so that the gateway sees them in order.
func (s *nodeSession) sendAttested(body *agentv1.AttestedBody) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.seq++
	body.NodeId, body.Epoch, body.Seq = s.id.NodeID, s.epoch, s.seq
	a, err := attest.Sign(s.key, body)
	if err != nil {
		return err
	}
	return s.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Attested{Attested: a}})
}

func (s *nodeSession) run(ctx context.Context, addr string) error {
	defer s.wg.Wait()
	defer s.endTunnels()
	defer s.cancel()
	a := s.a
	ds, applied, err := a.cfg.Store.Desired()
	if err != nil {
		return err
	}
	s.applied, s.holds = applied, ds
	first, err := s.hello(&agentv1.Hello{AgentVersion: a.cfg.Version, AppliedGeneration: applied, Facts: a.cfg.Facts})
	if err != nil {
		return s.classify(err)
	}
	w := first.GetWelcome()
	if w == nil {
		return errors.New("nodeagent: the gateway did not welcome the session")
	}
	s.epoch = w.GetEpoch()
	a.setStatus(func(st *Status) {
		st.NodeID, st.NodeName, st.Connected, st.Gateway, st.Epoch = s.id.NodeID, s.id.NodeName, true, addr, w.GetEpoch()
		st.Transport = s.transport
		st.CertNotAfter, st.LastError, st.AppliedGeneration = s.id.NotAfter, "", applied
		st.Sessions++
	})
	// What the last session left: inventory, and every result not yet acknowledged.
	if err := s.sendInventory(ctx); err != nil {
		return err
	}
	results, err := a.cfg.Store.Results()
	if err != nil {
		return err
	}
	for _, r := range results {
		if err := s.sendAttested(&agentv1.AttestedBody{Report: &agentv1.AttestedBody_Result{Result: r}}); err != nil {
			return s.classify(err)
		}
	}
	s.updatePending()
	s.maybeRenew()
	s.follow(w.GetHeartbeatInterval())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.beat(ctx)
	}()
	if r := a.cfg.Reports; r != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sendReports(ctx, r, time.Now())
		}()
	}
	for {
		m, err := s.st.Recv()
		if err != nil {
			return s.classify(err)
		}
		if err := s.handle(ctx, m); err != nil {
			return err
		}
	}
}

// classify turns what the gateway said into whether reconnecting can help. Only an explicit
// refusal by the session service (PermissionDenied: the node is retired or its certificate
// revoked) is final. A handshake that fails, whatever the TLS alert, is retried: an overloaded or
// misconfigured gateway, a proxy, a clock off by a minute all look the same as a refused
// certificate from here, and giving up on them would lose the node for good.
func (s *nodeSession) classify(err error) error { return classify(err) }

// hello opens the session: the hello, and the gateway's first answer. A gateway that refuses a
// session before reading its hello (a revoked certificate, a gateway not yet running) may have
// ended the stream before the hello is sent: the send then fails with io.EOF, and the refusal
// itself, which decides whether the node may try again, is what the receive answers.
func (s *nodeSession) hello(h *agentv1.Hello) (*agentv1.ServerMessage, error) {
	if err := s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Hello{Hello: h}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return s.st.Recv()
}

func classify(err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.PermissionDenied {
		return fmt.Errorf("%w: %v", ErrRetired, err)
	}
	return err
}

// defaultHeartbeatInterval is used until a gateway names one.
const defaultHeartbeatInterval = 10 * time.Second

// follow takes the heartbeat interval of a welcome or a heartbeat reply.
func (s *nodeSession) follow(d *durationpb.Duration) {
	interval := d.AsDuration()
	if d == nil || interval <= 0 {
		if s.heartbeatInterval() > 0 {
			return
		}
		interval = defaultHeartbeatInterval
	}
	s.mu.Lock()
	s.interval = interval
	s.mu.Unlock()
	s.a.setStatus(func(st *Status) { st.HeartbeatInterval = interval })
}

func (s *nodeSession) heartbeatInterval() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.interval
}

// beat sends heartbeats at the interval the gateway last asked for (in its welcome, then in
// every heartbeat reply), with ±10% jitter so that a fleet that reconnected at once does not
// beat in step, and forwards GPU events as they happen.
func (s *nodeSession) beat(ctx context.Context) {
	events := s.a.cfg.Hardware.Events()
	for {
		interval := s.heartbeatInterval()
		jitter := time.Duration(rand.Int64N(int64(interval/5)+1)) - interval/10
		select {
		case <-ctx.Done():
			return
		case e := <-events:
			if err := s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Health{Health: &agentv1.HealthReport{GpuEvents: []*agentv1.GPUEvent{e}}}}); err != nil {
				s.cancel()
				return
			}
		case <-time.After(interval + jitter):
			s.maybeRenew()
			s.mu.Lock()
			applied := s.applied
			s.mu.Unlock()
			if err := s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{
				AppliedGeneration: applied, Pressure: s.a.cfg.Hardware.Pressure()}}}); err != nil {
				s.cancel()
				return
			}
		}
	}
}

func (s *nodeSession) sendInventory(ctx context.Context) error {
	inv, err := s.a.cfg.Hardware.Inventory(ctx)
	if err != nil {
		inv = &agentv1.Inventory{GpuStatus: "inventory failed: " + err.Error()}
	}
	return s.classify(s.sendAttested(&agentv1.AttestedBody{Report: &agentv1.AttestedBody_Inventory{Inventory: inv}}))
}

func (s *nodeSession) handle(ctx context.Context, m *agentv1.ServerMessage) error {
	a := s.a
	switch b := m.Body.(type) {
	case *agentv1.ServerMessage_Desired:
		ds := b.Desired
		err := a.cfg.Converger.Apply(ctx, ds)
		if err == nil {
			s.mu.Lock()
			prev := s.holds
			s.mu.Unlock()
			err = a.applyParts(ctx, prev, ds)
		}
		applied := ds.GetGeneration()
		if err != nil {
			applied = s.currentApplied()
		}
		if serr := a.cfg.Store.SetDesired(ds, applied); serr != nil {
			return serr
		}
		s.mu.Lock()
		s.applied, s.holds = applied, ds
		s.mu.Unlock()
		s.endSharedRoot(ds)
		a.setStatus(func(st *Status) { st.AppliedGeneration, st.Holds = applied, len(ds.GetHolds()) })
		return s.classify(s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Ack{Ack: &agentv1.DesiredStateAck{
			Generation: ds.GetGeneration(), Error: errString(err)}}}))
	case *agentv1.ServerMessage_Command:
		state, err := a.cfg.Store.CommandState(b.Command.GetId())
		switch {
		case err != nil:
			return err
		case state == CommandDone:
			return nil // a repeat: its result, unless acknowledged, was resent at the session's start
		case state == CommandStarted:
			a.cfg.Logger.Info("nodeagent: running again a command a restart interrupted", "command", b.Command.GetId())
		}
		if err := a.cfg.Store.MarkStarted(b.Command.GetId()); err != nil {
			return err
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.execute(ctx, b.Command)
		}()
	case *agentv1.ServerMessage_ResultAck:
		if err := a.cfg.Store.DeleteResult(b.ResultAck.GetCommandId()); err != nil {
			return err
		}
		s.updatePending()
	case *agentv1.ServerMessage_TunnelOpen:
		s.openTunnel(ctx, b.TunnelOpen)
	case *agentv1.ServerMessage_TunnelInput:
		s.tunnelInput(b.TunnelInput)
	case *agentv1.ServerMessage_TunnelAck:
		if t := s.tunnelOf(b.TunnelAck.GetId()); t != nil {
			t.give(int64(b.TunnelAck.GetBytes()))
		}
	case *agentv1.ServerMessage_ReportAck:
		if r := a.cfg.Reports; r != nil {
			r.acked(b.ReportAck.GetId(), b.ReportAck.GetError())
		}
	case *agentv1.ServerMessage_Renewed:
		return s.renewed(b.Renewed)
	case *agentv1.ServerMessage_HeartbeatAck:
		s.follow(b.HeartbeatAck.GetHeartbeatInterval())
	case *agentv1.ServerMessage_Goodbye:
		return fmt.Errorf("nodeagent: the gateway ended the session: %s", b.Goodbye.GetReason())
	}
	return nil
}

func (s *nodeSession) currentApplied() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

func (s *nodeSession) updatePending() {
	rs, _ := s.a.cfg.Store.Results()
	s.a.setStatus(func(st *Status) { st.PendingResults = len(rs) })
}

// execute runs a command until its deadline and keeps its result in the journal before sending
// it, so that a restart reports it.
func (s *nodeSession) execute(ctx context.Context, c *agentv1.Command) {
	deadline := c.GetDeadline().AsTime()
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	out, err := s.carryOut(cctx, c)
	r := &agentv1.CommandResult{CommandId: c.GetId(), Ok: err == nil, Error: errString(err), FinishedAt: timestamppb.Now()}
	if out != nil {
		if st, e := structpb.NewStruct(out); e == nil {
			r.Output = st
		}
	}
	if err := s.a.cfg.Store.PutResult(r); err != nil {
		s.a.cfg.Logger.Error("nodeagent: keep a command result", "command", c.GetId(), "error", err)
		return
	}
	s.updatePending()
	_ = s.sendAttested(&agentv1.AttestedBody{Report: &agentv1.AttestedBody_Result{Result: r}})
}

func (s *nodeSession) carryOut(ctx context.Context, c *agentv1.Command) (map[string]any, error) {
	hw := s.a.cfg.Hardware
	args, err := DecodeArgs(c.GetKind(), c.GetArgs())
	if err != nil {
		return nil, err
	}
	switch c.GetKind() {
	case "inventory.refresh":
		if err := s.sendInventory(ctx); err != nil {
			return nil, err
		}
		inv, _ := hw.Inventory(ctx)
		return map[string]any{"gpus": len(inv.GetGpus())}, nil
	case "gpu.reset":
		idx, force := args.GPU, args.Force
		if holder := s.holderOf(int(idx)); holder != "" && !force {
			return nil, fmt.Errorf("GPU %d is held by %s; refusing to reset it without force", int(idx), holder)
		}
		if err := hw.ResetGPU(ctx, int(idx)); err != nil {
			return nil, err
		}
		// The reset cleared the GPU's faults: report it.
		_ = s.sendInventory(ctx)
		return map[string]any{"gpu": int(idx), "reset": true}, nil
	case "health.check":
		return hw.HealthCheck(ctx)
	case "diag.run":
		return hw.Diag(ctx, args.Test, args.Seconds)
	}
	if run, ok := s.a.exts.Command(c.GetKind()); ok {
		return run(ext.WithSecret(ctx, c.GetSecret()), c.GetArgs().AsMap())
	}
	return nil, fmt.Errorf("unknown command kind %q", c.GetKind())
}

// applyParts converges the modules' parts of a desired state through the extensions: each part
// present, and each kind prev had that ds no longer has (with a nil payload). A part no extension
// converges fails the whole state, so that the control plane sees the node did not apply it.
func (a *Agent) applyParts(ctx context.Context, prev, ds *agentv1.DesiredState) error {
	seen := map[string]bool{}
	for _, p := range ds.GetParts() {
		apply, ok := a.exts.Converger(p.GetKind())
		if !ok && p.GetOptional() {
			continue // a part this node has no use for (it runs no sshd, say)
		}
		if !ok {
			return fmt.Errorf("no extension of this node converges desired-state kind %q", p.GetKind())
		}
		if err := apply(ctx, p.GetVersion(), p.GetPayload()); err != nil {
			return fmt.Errorf("desired-state kind %s: %w", p.GetKind(), err)
		}
		seen[p.GetKind()] = true
	}
	for _, p := range prev.GetParts() {
		if apply, ok := a.exts.Converger(p.GetKind()); ok && !seen[p.GetKind()] {
			if err := apply(ctx, p.GetVersion(), nil); err != nil {
				return fmt.Errorf("desired-state kind %s (now empty): %w", p.GetKind(), err)
			}
			seen[p.GetKind()] = true
		}
	}
	return nil
}

func (s *nodeSession) holderOf(index int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.holds.GetHolds() {
		for _, g := range h.GetGpus() {
			if int(g.GetIndex()) == index {
				return h.GetHolder()
			}
		}
	}
	return ""
}

// maybeRenew asks for a new certificate once half of the current one's life has passed, unless
// a renewal is already in flight.
func (s *nodeSession) maybeRenew() {
	s.mu.Lock()
	inFlight, certDER := s.renewal != nil, s.id.CertDER
	s.mu.Unlock()
	if inFlight {
		return
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return
	}
	half := cert.NotBefore.Add(cert.NotAfter.Sub(cert.NotBefore) / 2)
	if time.Now().Before(half) {
		return
	}
	keyDER, csrDER, err := NewKey()
	if err != nil {
		return
	}
	s.mu.Lock()
	s.renewal = keyDER
	s.mu.Unlock()
	_ = s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Renew{Renew: &agentv1.RenewRequest{CsrDer: csrDER}}})
}

// renewed keeps the new certificate with the key made for it; the next connection uses them.
func (s *nodeSession) renewed(r *agentv1.Renewed) error {
	s.mu.Lock()
	key := s.renewal
	s.renewal = nil
	s.mu.Unlock()
	if key == nil {
		return nil
	}
	id, ok, err := s.a.cfg.Store.Identity()
	if err != nil || !ok {
		return err
	}
	if err := checkRenewed(id, key, r); err != nil {
		s.a.cfg.Logger.Warn("nodeagent: refused a renewed certificate; keeping the current one", "error", err)
		return nil
	}
	id.KeyDER, id.CertDER, id.NotAfter = key, r.GetCertificateDer(), r.GetNotAfter().AsTime()
	if err := s.a.cfg.Store.SetIdentity(id); err != nil {
		return err
	}
	s.mu.Lock()
	s.id = id
	s.mu.Unlock()
	s.a.setStatus(func(st *Status) { st.CertNotAfter = id.NotAfter })
	return nil
}
