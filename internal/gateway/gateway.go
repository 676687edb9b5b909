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
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/internal/nodes"
	"github.com/better-compute/compute/modules"
)

// Defaults.
const (
	DefaultFlushInterval = time.Second
	DefaultPollInterval  = 2 * time.Second
	// DefaultHeartbeatBudget is how many heartbeats a second one gateway asks of its nodes in
	// all: with 1,000 sessions each node beats every 10 s.
	DefaultHeartbeatBudget = 100
	MinHeartbeatInterval   = 5 * time.Second
	MaxHeartbeatInterval   = 60 * time.Second
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
}

// Gateway serves sessions. Run must be running for sessions to be accepted.
type Gateway struct {
	cfg Config
	mod *nodes.Module
	rt  *modules.Runtime
	log *slog.Logger

	mu       sync.Mutex
	running  bool
	sessions map[string]*session // by node id
	touched  map[string]*touch   // since the last flush
}

// touch is what a flush writes for one node.
type touch struct {
	epoch   int64
	seen    time.Time
	applied int64
	errText string
	ack     bool
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
	return &Gateway{cfg: cfg, mod: mod, sessions: map[string]*session{}, touched: map[string]*touch{}}
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

// grace is how long a silent session keeps its node online.
func (g *Gateway) grace() time.Duration { return 3*g.HeartbeatInterval() + 2*g.cfg.FlushInterval }

// Run serves until ctx ends: it listens for commands, desired-state changes and takeovers,
// flushes heartbeats and polls. On return every session has been closed.
func (g *Gateway) Run(ctx context.Context, rt *modules.Runtime) error {
	g.mu.Lock()
	if g.running {
		g.mu.Unlock()
		return errors.New("gateway: already running")
	}
	g.running, g.rt, g.log = true, rt, rt.Logger.With("gateway", g.cfg.ID)
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
	errc := make(chan error, 3)
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context) error{g.listen, g.flushLoop, g.pollLoop} {
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

// listen follows the notifications of the nodes this gateway holds.
func (g *Gateway) listen(ctx context.Context) error {
	pooled, err := g.rt.DB.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening connection is not returned to the pool in a listening state: it is taken out
	// of the pool and closed when done.
	conn := pooled.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	for _, ch := range []string{nodes.CommandsChannel, nodes.DesiredChannel, SessionsChannel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return fmt.Errorf("gateway: listen %s: %w", ch, err)
		}
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		g.notified(n.Channel, n.Payload)
	}
}

func (g *Gateway) notified(channel, payload string) {
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
	if f != nil {
		f(t)
	}
}

func (g *Gateway) flushLoop(ctx context.Context) error {
	return modules.Every(ctx, g.cfg.FlushInterval, func() error {
		// A failed flush is not the gateway failing: its heartbeats are lost, and the nodes' next
		// ones, well within their grace, are written by a later flush.
		if err := g.flush(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "gateway: flush heartbeats", "error", err)
		}
		return nil
	})
}

// flush writes every heartbeat and acknowledgement since the last flush in three statements,
// whatever the number of nodes: the sessions' last sight and grace, the nodes' last sight (and
// online again, for a node marked offline while its session lived), and applied generations.
func (g *Gateway) flush(ctx context.Context) error {
	g.mu.Lock()
	batch := g.touched
	g.touched = map[string]*touch{}
	g.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	grace := g.grace()
	var ids, ackIDs, ackErrs []string
	var epochs, acks []int64
	var seen []time.Time
	for id, t := range batch {
		ids, epochs, seen = append(ids, id), append(epochs, t.epoch), append(seen, t.seen)
		if t.ack {
			ackIDs, acks, ackErrs = append(ackIDs, id), append(acks, t.applied), append(ackErrs, t.errText)
		}
	}
	return g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`UPDATE compute.node_sessions s SET last_seen_at = u.t, offline_after = u.t + make_interval(secs => $5)
			FROM unnest($1::uuid[], $2::bigint[], $3::timestamptz[]) AS u(n, e, t)
			WHERE s.node_id = u.n AND s.epoch = u.e AND s.gateway_id = $4`, ids, epochs, seen, g.cfg.ID, grace.Seconds())
		b.Queue(`UPDATE compute.nodes n SET last_seen_at = u.t FROM unnest($1::uuid[], $2::timestamptz[]) AS u(n, t) WHERE n.id = u.n`, ids, seen)
		if len(ackIDs) > 0 {
			b.Queue(`UPDATE compute.node_desired d SET applied_generation = greatest(d.applied_generation, u.g), applied_error = u.e
				FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS u(n, g, e) WHERE d.node_id = u.n`, ackIDs, acks, ackErrs)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// pollLoop is the safety net under LISTEN/NOTIFY: a notification lost while the listening
// connection was down still reaches its node within a poll.
func (g *Gateway) pollLoop(ctx context.Context) error {
	return modules.Every(ctx, g.cfg.PollInterval, func() error {
		if err := g.poll(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "gateway: poll", "error", err)
		}
		return nil
	})
}

// poll wakes every session held here whose node has a pending command or a newer desired state
// than it was sent.
func (g *Gateway) poll(ctx context.Context) error {
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
		  coalesce((SELECT generation FROM compute.node_desired d WHERE d.node_id = n), 0)
		FROM unnest($1::uuid[]) AS n`, held)
	if err != nil {
		return err
	}
	var id string
	var pending bool
	var gen int64
	_, err = pgx.ForEachRow(rows, []any{&id, &pending, &gen}, func() error {
		if s := g.session(id); s != nil && (pending || gen > sent[id]) {
			s.wake(pending, gen > sent[id])
		}
		return nil
	})
	return err
}
