// Package gateway serves node sessions: the SessionService of agent/v1 over gRPC on mutual TLS.
// It records which gateway holds each node's session (with an epoch, so a reconnect elsewhere
// takes it over), coalesces heartbeats into a few writes a second whatever the fleet's size,
// turns inventory and health reports into devices and rollups, pushes desired state and routes
// commands to their node through LISTEN/NOTIFY, with polling as the safety net. Fleet paths never
// call IAM.
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/metrics"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/modules"
)

// Defaults.
const (
	DefaultFlushInterval = time.Second
	DefaultPollInterval  = 2 * time.Second
	// DefaultHeartbeatBudget is how many heartbeats a second one gateway asks of its nodes in
	// all, up to MaxHeartbeatInterval: with 600 sessions each node beats every 6 s.
	DefaultHeartbeatBudget = 100
	MinHeartbeatInterval   = 5 * time.Second
	// MaxHeartbeatInterval bounds the grace of a silent node (three intervals and two flushes)
	// to 26 s: its last heartbeat is written by a flush up to a second later and the worker's
	// next tick a second after its grace takes it offline, within 28 s and the tick's own time
	// at any fleet size (with 9 s, 10,000 nodes stopped at once took 30.4 s to be offline, all
	// of them). Past 800 sessions the budget is exceeded rather than detection slowed:
	// heartbeats cost rows in the once-a-second flush, not statements.
	MaxHeartbeatInterval = 8 * time.Second
	// DefaultRevocationsReload is how often the revocation set is reloaded whole, the safety
	// net under its notifications.
	DefaultRevocationsReload = time.Minute
	// DefaultAdmitRate is how many new sessions a second a gateway admits, with bursts of
	// DefaultAdmitBurst: each costs a claim transaction, then an inventory report, a desired-state
	// push and a dispatch. A storm of reconnects (10,000 agents at once) beyond it is refused
	// with Unavailable, which agents retry with jittered backoff, instead of queueing in the
	// database pool until handshakes and streams time out. 200 a second is twice what the
	// 2-core benchmark machine admitted unthrottled (docs/benchmarks.md).
	DefaultAdmitRate  = 200
	DefaultAdmitBurst = 200
	// maxListenBackoff bounds the wait between attempts to listen again.
	maxListenBackoff = 30 * time.Second
)

// SessionsChannel announces a session taken over: "<node id>:<epoch>".
const SessionsChannel = "compute_sessions"

// Config configures a gateway. Zero values mean the defaults.
type Config struct {
	ID                string        // default: hostname and a random suffix
	HeartbeatInterval time.Duration // fixed; default: from the session count and the budget
	HeartbeatBudget   int           // heartbeats a second, in all
	FlushInterval     time.Duration
	PollInterval      time.Duration
	RevocationsReload time.Duration
	AdmitRate         float64 // new sessions a second
	AdmitBurst        int
	Metrics           *metrics.Metrics // nil: none recorded
}

// Gateway serves sessions. Run must be running for sessions to be accepted.
type Gateway struct {
	cfg Config
	mod *nodes.Module
	rt  *modules.Runtime
	log *slog.Logger
	// revoked is the revocation set handshakes are checked against, in memory.
	revoked *pki.Revocations
	// admission bounds the rate of new sessions, handshakes the rate of the TLS handshakes
	// before them (see AdmitHandshake).
	admission, handshakes *rate.Limiter

	mu       sync.Mutex
	running  bool
	sessions map[string]*session // by node id
	touched  map[string]*touch   // since the last flush
	closing  map[string]int64    // node → epoch of a session whose stream ended, since the last flush
}

// touch is what a flush writes for one node.
type touch struct {
	epoch   int64
	seen    time.Time
	applied int64
	errText string
	acked   bool // a DesiredStateAck came (errText is its error); a heartbeat's leaves the error as it was
	ack     bool
	grace   time.Duration // from the interval the node was last told
	health  string        // from the host pressure of its last heartbeat; "" without one
}

// New returns a gateway of the nodes module. It touches nothing until Run.
func New(mod *nodes.Module, cfg Config) *Gateway {
	if cfg.ID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.ID = host + "-" + hex.EncodeToString(b)
	}
	if cfg.HeartbeatBudget == 0 {
		cfg.HeartbeatBudget = DefaultHeartbeatBudget
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.RevocationsReload == 0 {
		cfg.RevocationsReload = DefaultRevocationsReload
	}
	if cfg.AdmitRate == 0 {
		cfg.AdmitRate = DefaultAdmitRate
	}
	if cfg.AdmitBurst == 0 {
		cfg.AdmitBurst = DefaultAdmitBurst
	}
	return &Gateway{cfg: cfg, mod: mod, sessions: map[string]*session{}, touched: map[string]*touch{}, closing: map[string]int64{},
		revoked:   pki.NewRevocations(),
		admission: rate.NewLimiter(rate.Limit(cfg.AdmitRate), cfg.AdmitBurst), handshakes: rate.NewLimiter(rate.Limit(cfg.AdmitRate), cfg.AdmitBurst)}
}

// AdmitHandshake is a gateway listener's tls.Config.GetConfigForClient (GatewayTLS sets it): it
// refuses a TLS handshake beyond the admission rate as soon as its ClientHello is read, before
// any cryptography, and the agent retries with its backoff. Without it, 10,000 agents dialling
// at once all began handshakes that then starved each other of CPU past the server's handshake
// timeout (hundreds of "TLS handshake error … i/o timeout" at 10,000 on two cores), and the
// admission of sessions came only after the work it was meant to spare. Both admissions use the
// same rate: a session follows its handshake.
func (g *Gateway) AdmitHandshake(*tls.ClientHelloInfo) (*tls.Config, error) {
	if !g.handshakes.Allow() {
		g.cfg.Metrics.Refused("handshake")
		return nil, ErrBusy
	}
	return nil, nil
}

// ID is the gateway's name in the sessions table.
func (g *Gateway) ID() string { return g.cfg.ID }

// heartbeatInterval spreads the budget over the sessions held.
// HeartbeatInterval is the interval the gateway asks of its nodes now.
func (g *Gateway) HeartbeatInterval() time.Duration {
	if g.cfg.HeartbeatInterval > 0 {
		return g.cfg.HeartbeatInterval
	}
	g.mu.Lock()
	n := len(g.sessions)
	g.mu.Unlock()
	d := time.Duration(float64(n) / float64(g.cfg.HeartbeatBudget) * float64(time.Second))
	return min(max(d, MinHeartbeatInterval), MaxHeartbeatInterval)
}

// grace is how long a silent session keeps its node online, for a node told to beat every
// interval: what counts is what that node was told, not what the gateway would say now.
func (g *Gateway) grace(interval time.Duration) time.Duration {
	return 3*interval + 2*g.cfg.FlushInterval
}

// Run serves until ctx ends: it listens for commands, desired-state changes and takeovers,
// flushes heartbeats and polls. On return every session has been closed.
func (g *Gateway) Run(ctx context.Context, rt *modules.Runtime) error {
	g.mu.Lock()
	if g.running {
		g.mu.Unlock()
		return errors.New("gateway: already running")
	}
	g.rt, g.log = rt, rt.Logger.With("gateway", g.cfg.ID)
	g.mu.Unlock()
	// Sessions are refused (unavailable, which nodes retry) until revocations are known.
	if err := g.revoked.Load(ctx, rt.DB.Pool); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.mu.Lock()
	g.running = true
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		for _, s := range g.sessions {
			s.close("gateway stopping")
		}
		g.running = false
		g.mu.Unlock()
		// The last heartbeats are worth keeping.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = g.flush(fctx)
		cancel()
	}()
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context) error{g.listen, g.flushLoop, g.pollLoop, g.revocationsLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loop(ctx); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	wg.Wait()
	return err
}

// listen follows the notifications of the nodes this gateway holds. Its connection is listened
// on again, with capped and jittered backoff, whenever it is lost (a database restart): the poll
// covers what is missed meanwhile, and each return catches up at once.
func (g *Gateway) listen(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			// What was announced while not listening: revocations, takeovers, work.
			if err := g.catchUp(ctx); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "gateway: catch up after listening again", "error", err)
			}
		}
		err := g.listenOnce(ctx, func() {
			if attempt > 0 {
				g.log.InfoContext(ctx, "gateway: listening again for notifications")
			}
			backoff = 100 * time.Millisecond // it worked: the next loss starts over
		})
		if ctx.Err() != nil {
			return nil
		}
		wait := backoff/2 + mrand.N(backoff/2+1)
		g.log.WarnContext(ctx, "gateway: lost the listening connection; commands fall back to polling until it is back",
			"error", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, maxListenBackoff)
	}
	return nil
}

// listenOnce listens on one connection until it fails; listening is called once it listens.
func (g *Gateway) listenOnce(ctx context.Context, listening func()) error {
	pooled, err := g.rt.DB.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening connection is not returned to the pool in a listening state: it is taken out
	// of the pool and closed when done.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range []string{nodes.CommandsChannel, nodes.DesiredChannel, SessionsChannel, pki.RevocationsChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return fmt.Errorf("gateway: listen %s: %w", ch, err)
		}
	}
	listening()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		g.notified(ctx, n.Channel, n.Payload)
	}
}

// catchUp does what lost notifications would have done, however long ago: it reconciles every
// session held.
func (g *Gateway) catchUp(ctx context.Context) error {
	if err := g.reloadRevocations(ctx); err != nil {
		return err
	}
	return g.reconcile(ctx)
}

func (g *Gateway) notified(ctx context.Context, channel, payload string) {
	switch channel {
	case nodes.CommandsChannel, nodes.DesiredChannel:
		if s := g.session(payload); s != nil {
			s.wake(channel == nodes.CommandsChannel, channel == nodes.DesiredChannel)
		}
	case SessionsChannel:
		var node string
		var epoch int64
		if _, err := fmt.Sscanf(payload, "%36s:%d", &node, &epoch); err != nil {
			return
		}
		if s := g.session(node); s != nil && s.epoch < epoch {
			s.close("the session was taken over by a newer connection")
		}
	case pki.RevocationsChannel:
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := g.revoked.LoadNode(lctx, g.rt.DB.Pool, payload); err != nil {
			// The periodic reload will learn of it.
			g.log.WarnContext(ctx, "gateway: load a node's revocations", "node", payload, "error", err)
			return
		}
		g.closeRevoked()
	}
}

// revocationsLoop reloads the revocation set whole now and then, in case a notification was lost.
func (g *Gateway) revocationsLoop(ctx context.Context) error {
	t := time.NewTicker(g.cfg.RevocationsReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := g.reloadRevocations(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "gateway: reload revocations", "error", err)
		}
	}
}

func (g *Gateway) reloadRevocations(ctx context.Context) error {
	if err := g.revoked.Load(ctx, g.rt.DB.Pool); err != nil {
		return err
	}
	g.closeRevoked()
	return nil
}

// closeRevoked ends every session whose certificate is revoked.
func (g *Gateway) closeRevoked() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.sessions {
		if g.revoked.Revoked(s.serial) {
			s.close("the node's certificate was revoked")
		}
	}
}

func (g *Gateway) session(node string) *session {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[node]
}

// Sessions is how many sessions the gateway holds.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)
}

func (g *Gateway) touch(node string, epoch int64, f func(*touch)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.touched[node]
	if t == nil || t.epoch != epoch {
		t = &touch{epoch: epoch}
		g.touched[node] = t
	}
	t.seen = time.Now()
	if s := g.sessions[node]; s != nil && s.epoch == epoch {
		t.grace = g.grace(s.interval())
	}
	if f != nil {
		f(t)
	}
}

func (g *Gateway) flushLoop(ctx context.Context) error {
	return modules.Every(modules.TicksAs(ctx, "gateway.flush"), g.cfg.FlushInterval, func() error {
		// A failed flush is not the gateway failing: its heartbeats are lost, and the nodes' next
		// ones, well within their grace, are written by a later flush; its closed sessions' nodes
		// go offline when their grace runs out.
		if err := g.flush(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "gateway: flush heartbeats", "error", err)
		}
		return nil
	})
}

// flush writes every heartbeat and acknowledgement since the last flush in a few statements,
// whatever the number of nodes: the sessions whose streams ended closed and their nodes offline,
// the sessions' last sight and grace (from the interval each node
// was told), the nodes' last sight, applied generations, the health host pressure gives, and
// online again for a node marked offline while its session lived (a process stopped a while,
// then continued).
func (g *Gateway) flush(ctx context.Context) error {
	g.mu.Lock()
	batch, closing := g.touched, g.closing
	g.touched, g.closing = map[string]*touch{}, map[string]int64{}
	g.mu.Unlock()
	if len(batch) == 0 && len(closing) == 0 {
		return nil
	}
	start := time.Now()
	err := g.write(ctx, batch, closing)
	g.cfg.Metrics.Flush(len(batch)+len(closing), time.Since(start), err)
	return err
}

// write is flush's transaction: what batch and closing hold, in a few statements.
func (g *Gateway) write(ctx context.Context, batch map[string]*touch, closing map[string]int64) error {
	// In node order, as every writer of many node rows takes them.
	ids := make([]string, 0, len(batch)+len(closing))
	for id := range batch {
		ids = append(ids, id)
	}
	closed := make([]nodes.SessionClosed, 0, len(closing))
	for id, epoch := range closing {
		closed = append(closed, nodes.SessionClosed{Node: id, Epoch: epoch})
		if batch[id] == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	sessions := make([]nodes.SessionSeen, 0, len(batch))
	seen := make([]fleet.Seen, 0, len(batch))
	var acks []nodes.Applied
	health := map[string]string{} // node → health from host pressure
	for _, id := range ids {
		t := batch[id]
		if t == nil {
			continue
		}
		grace := t.grace
		if grace == 0 {
			grace = g.grace(g.HeartbeatInterval())
		}
		sessions = append(sessions, nodes.SessionSeen{Node: id, Epoch: t.epoch, At: t.seen, Grace: grace})
		seen = append(seen, fleet.Seen{Node: id, At: t.seen})
		if t.ack {
			acks = append(acks, nodes.Applied{Node: id, Generation: t.applied, Error: t.errText, Acked: t.acked})
		}
		if t.health != "" {
			health[id] = t.health
		}
	}
	return g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		// The nodes' rows first, in id order, as every path that changes a node takes them (a
		// session's claim, MarkOffline): updating sessions or nodes in the order of a join would
		// deadlock with those.
		if err := fleet.LockNodes(ctx, tx, ids); err != nil {
			return err
		}
		// Closed first: a closed session takes no more heartbeats, so its last ones cannot put
		// its node back online below.
		if len(closed) > 0 {
			if _, err := nodes.CloseSessions(ctx, tx, g.cfg.ID, closed); err != nil {
				return err
			}
		}
		held, err := nodes.TouchSessions(ctx, tx, g.cfg.ID, sessions)
		if err != nil {
			return err
		}
		if err := fleet.MarkSeen(ctx, tx, seen); err != nil {
			return err
		}
		if len(acks) > 0 {
			if err := nodes.RecordApplied(ctx, tx, acks); err != nil {
				return err
			}
		}
		if err := setHealth(ctx, tx, held, health); err != nil {
			return err
		}
		return g.backOnline(ctx, tx, held)
	})
}

// setHealth records the health host pressure gives the nodes among held, one statement per
// health at most (three), whatever the number of heartbeats.
func setHealth(ctx context.Context, tx pgx.Tx, held []string, health map[string]string) error {
	by := map[string][]string{}
	for _, id := range held { // in id order, as held is
		if h := health[id]; h != "" {
			by[h] = append(by[h], id)
		}
	}
	for _, h := range []string{api.HealthHealthy, api.HealthDegraded, api.HealthUnhealthy} {
		if len(by[h]) > 0 {
			if err := fleet.SetHealth(ctx, tx, by[h], h); err != nil {
				return err
			}
		}
	}
	return nil
}

// backOnline puts online again the nodes among held (those whose session this gateway holds at
// the epoch it flushed) that were marked offline while it held them; the rollups' trigger then
// lets them take bookings.
func (g *Gateway) backOnline(ctx context.Context, tx pgx.Tx, held []string) error {
	back, err := fleet.SetStatus(ctx, tx, held, api.NodeOnline)
	if err != nil {
		return err
	}
	tenants, subjects := make([]string, len(back)), make([]string, len(back))
	for i, n := range back {
		tenants[i], subjects[i] = n.TenantID, n.ID
	}
	return events.EmitEach(ctx, tx, "node.online", tenants, subjects, map[string]any{"gateway": g.cfg.ID, "heartbeat": true})
}

// pollLoop is the safety net under LISTEN/NOTIFY: a notification lost while the listening
// connection was down still reaches its node within a poll.
func (g *Gateway) pollLoop(ctx context.Context) error {
	return modules.Every(modules.TicksAs(ctx, "gateway.poll"), g.cfg.PollInterval, func() error {
		if err := g.poll(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "gateway: poll", "error", err)
		}
		return nil
	})
}

// pollLookback is how far back the poll reads changes: a change's clock is its transaction's
// start, so one that took this long to commit is left to its notification.
const pollLookback = time.Minute

// poll wakes the sessions held here whose node has a pending command or a desired state moved
// past what it was sent, and lets go of those taken over, reading by index only what changed
// lately (nodes.Poll): its cost follows the changes, not the number of sessions held.
func (g *Gateway) poll(ctx context.Context) error {
	if g.Sessions() == 0 {
		return nil
	}
	w, err := nodes.Poll(ctx, g.rt.DB.Pool, g.cfg.ID, pollLookback)
	if err != nil {
		return err
	}
	for node, epoch := range w.Sessions {
		if s := g.session(node); s != nil && epoch > s.epoch {
			s.close("the session was taken over by a newer connection")
		}
	}
	for _, node := range w.Commands {
		if s := g.session(node); s != nil {
			s.wake(true, false)
		}
	}
	for node, gen := range w.Desired {
		if s := g.session(node); s != nil && gen > s.sentGeneration() {
			s.wake(false, true)
		}
	}
	return nil
}

// reconcile wakes every session held here whose node has a pending command or a newer desired
// state than it was sent, and lets go of those taken over: one query over all of them, for when
// notifications may have been lost for longer than the poll looks back.
func (g *Gateway) reconcile(ctx context.Context) error {
	g.mu.Lock()
	held := make([]string, 0, len(g.sessions))
	sent := map[string]int64{}
	for id, s := range g.sessions {
		held = append(held, id)
		sent[id] = s.sentGeneration()
	}
	g.mu.Unlock()
	if len(held) == 0 {
		return nil
	}
	rows, err := g.rt.DB.Pool.Query(ctx, `SELECT n::text,
		  EXISTS (SELECT 1 FROM compute.commands c WHERE c.node_id = n AND c.state = 'pending'),
		  coalesce((SELECT generation FROM compute.node_desired d WHERE d.node_id = n), 0),
		  coalesce((SELECT s.epoch FROM compute.node_sessions s WHERE s.node_id = n), 0)
		FROM unnest($1::uuid[]) AS n`, held)
	if err != nil {
		return err
	}
	var id string
	var pending bool
	var gen, epoch int64
	_, err = pgx.ForEachRow(rows, []any{&id, &pending, &gen, &epoch}, func() error {
		s := g.session(id)
		switch {
		case s == nil:
		case epoch > s.epoch: // a takeover whose notification was lost
			s.close("the session was taken over by a newer connection")
		case pending || gen > sent[id]:
			s.wake(pending, gen > sent[id])
		}
		return nil
	})
	return err
}
