package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Tunnel is a holder's tunnel to a node (a command run there, or its console), carried by the
// node's session on this gateway: what the holder sends goes in with Input; Next returns the
// command's output in order, then its exit.
type Tunnel struct {
	ID          string
	Reservation string // the reservation it was opened for; "" for an operator's
	s           *session

	mu     sync.Mutex
	queue  []*agentv1.TunnelOutput
	queued int // bytes
	exit   *agentv1.TunnelExit
	signal chan struct{}
	credit int           // input bytes the node may be sent now
	inWake chan struct{} // credit returned, or the tunnel ended
}

// ErrNoSession is a tunnel to a node whose session this gateway does not hold.
var ErrNoSession = errors.New("gateway: this process holds no session of the node")

// OpenTunnel opens a tunnel to a node whose session this gateway holds.
func (g *Gateway) OpenTunnel(ctx context.Context, node, reservation string, open *agentv1.TunnelOpen) (*Tunnel, error) {
	g.mu.Lock()
	s := g.sessions[node]
	g.mu.Unlock()
	if s == nil {
		return nil, ErrNoSession
	}
	t := &Tunnel{ID: open.GetId(), Reservation: reservation, s: s, signal: make(chan struct{}, 1), credit: agentv1.TunnelWindow, inWake: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.tunnels == nil {
		s.tunnels = map[string]*Tunnel{}
	}
	if s.closed {
		s.mu.Unlock()
		return nil, ErrNoSession
	}
	s.tunnels[t.ID] = t
	s.mu.Unlock()
	if !s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_TunnelOpen{TunnelOpen: open}}) {
		t.finish(&agentv1.TunnelExit{Id: t.ID, ExitCode: -1, Error: "the node's session ended"})
		return nil, ErrNoSession
	}
	return t, nil
}

// MaxInput bounds the data of one Input.
const MaxInput = 64 << 10

// Input sends what the holder typed, a resize, the end of input, or a close. Data waits for the
// node's credit: a command that does not read its input stalls its holder, not the session.
// False: the tunnel or ctx ended.
func (t *Tunnel) Input(ctx context.Context, in *agentv1.TunnelInput) bool {
	in.Id = t.ID
	if n := len(in.GetData()); n > 0 {
		if n > MaxInput {
			return false
		}
		for {
			t.mu.Lock()
			ended, ok := t.exit != nil, t.credit >= n
			if ok && !ended {
				t.credit -= n
			}
			t.mu.Unlock()
			if ended {
				return false
			}
			if ok {
				break
			}
			select {
			case <-t.inWake:
			case <-ctx.Done():
				return false
			}
		}
	}
	return t.s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_TunnelInput{TunnelInput: in}})
}

// credited takes the node's acknowledgement of input written.
func (t *Tunnel) credited(n uint64) {
	t.mu.Lock()
	t.credit = min(t.credit+int(min(n, agentv1.TunnelWindow)), agentv1.TunnelWindow)
	t.mu.Unlock()
	wake(t.inWake)
}

// Next returns the next output (out), or the exit (exit, and the tunnel is done), waiting for
// one until ctx ends. Each output taken returns its bytes to the node's window.
func (t *Tunnel) Next(ctx context.Context) (out *agentv1.TunnelOutput, exit *agentv1.TunnelExit, err error) {
	for {
		t.mu.Lock()
		if len(t.queue) > 0 {
			out = t.queue[0]
			t.queue = t.queue[1:]
			t.queued -= len(out.GetData())
			t.mu.Unlock()
			t.s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_TunnelAck{TunnelAck: &agentv1.TunnelAck{Id: t.ID, Bytes: uint64(len(out.GetData()))}}})
			return out, nil, nil
		}
		if t.exit != nil {
			exit = t.exit
			t.mu.Unlock()
			return nil, exit, nil
		}
		t.mu.Unlock()
		select {
		case <-t.signal:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// Close ends the tunnel from the holder's side: the node kills its command.
func (t *Tunnel) Close() {
	t.mu.Lock()
	done := t.exit != nil
	t.mu.Unlock()
	if !done {
		t.Input(context.Background(), &agentv1.TunnelInput{Close: true})
	}
	t.s.forget(t.ID)
}

func (t *Tunnel) wake() {
	wake(t.signal)
	wake(t.inWake)
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// output queues the node's output; a node that sends more than its window ends the tunnel.
func (t *Tunnel) output(o *agentv1.TunnelOutput) {
	t.mu.Lock()
	if t.exit == nil {
		if t.queued+len(o.GetData()) > agentv1.TunnelWindow {
			t.exit = &agentv1.TunnelExit{Id: t.ID, ExitCode: -1, Error: "the node sent past its window"}
		} else {
			t.queue = append(t.queue, o)
			t.queued += len(o.GetData())
		}
	}
	t.mu.Unlock()
	t.wake()
}

// finish records the tunnel's end (the first one counts).
func (t *Tunnel) finish(e *agentv1.TunnelExit) {
	t.mu.Lock()
	if t.exit == nil {
		t.exit = e
	}
	t.mu.Unlock()
	t.wake()
}

func (s *session) tunnel(id string) *Tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tunnels[id]
}

func (s *session) forget(id string) {
	s.mu.Lock()
	delete(s.tunnels, id)
	s.mu.Unlock()
}

// endTunnels ends every tunnel of a session that ended.
func (s *session) endTunnels(why string) {
	s.mu.Lock()
	ending := s.tunnels
	s.tunnels = nil
	s.mu.Unlock()
	for _, t := range ending {
		t.finish(&agentv1.TunnelExit{Id: t.ID, ExitCode: -1, Error: why})
	}
}

// endTunnelsOf ends the tunnels of reservations that no longer hold the node.
func (s *session) endTunnelsOf(ctx context.Context, held map[string]bool) {
	s.mu.Lock()
	var ending []*Tunnel
	for _, t := range s.tunnels {
		if t.Reservation != "" && !held[t.Reservation] {
			ending = append(ending, t)
		}
	}
	s.mu.Unlock()
	for _, t := range ending {
		t.finish(&agentv1.TunnelExit{Id: t.ID, ExitCode: -1, Error: fmt.Sprintf("reservation %s no longer holds the node", t.Reservation)})
		t.Input(ctx, &agentv1.TunnelInput{Close: true})
		s.forget(t.ID)
	}
}
