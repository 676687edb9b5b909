package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/creack/pty"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Tunnels: a holder's command run on the node (exec, in a pseudo-terminal or with pipes) or the
// node's console attached, its bytes carried by the session (agent/v1 TunnelOpen and the rest).
// Each tunnel belongs to the session that opened it and ends with it.

// tunnelChunk bounds one output message.
const tunnelChunk = 32 << 10

type tunnel struct {
	id     string
	cancel context.CancelFunc
	stdin  io.WriteCloser
	pty    *os.File // set for a tty exec

	// reservation and root are whose tunnel it is (agentv1.TunnelOpen): a root tunnel of a
	// reservation ends once the reservation no longer holds the whole node.
	reservation string
	root        bool

	mu     sync.Mutex
	cond   *sync.Cond
	credit int64 // bytes of output it may send now
	closed bool
	input  []*agentv1.TunnelInput // the holder's data and end of input, to write in order
}

// take waits until n bytes of credit are free (or the tunnel ends) and takes them.
func (t *tunnel) take(n int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.credit < n && !t.closed {
		t.cond.Wait()
	}
	if t.closed {
		return false
	}
	t.credit -= n
	return true
}

func (t *tunnel) give(n int64) {
	t.mu.Lock()
	t.credit = min(t.credit+n, agentv1.TunnelWindow)
	t.mu.Unlock()
	t.cond.Broadcast()
}

// queueInput queues data or the end of input for the tunnel's writer.
func (t *tunnel) queueInput(in *agentv1.TunnelInput) {
	t.mu.Lock()
	t.input = append(t.input, in)
	t.mu.Unlock()
	t.cond.Broadcast()
}

// nextInput waits for the next input to write; false once the tunnel ended.
func (t *tunnel) nextInput() (*agentv1.TunnelInput, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.input) == 0 && !t.closed {
		t.cond.Wait()
	}
	if t.closed {
		return nil, false
	}
	in := t.input[0]
	t.input = t.input[1:]
	return in, true
}

func (t *tunnel) end() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cond.Broadcast()
	t.cancel()
}

// tunnelOf finds a session's tunnel.
func (s *nodeSession) tunnelOf(id string) *tunnel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tunnels[id]
}

// openTunnel starts a tunnel: its command, or its console connection. What cannot start is a
// TunnelExit with the reason.
func (s *nodeSession) openTunnel(ctx context.Context, o *agentv1.TunnelOpen) {
	exit := func(code int32, why string) {
		_ = s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_TunnelExit{TunnelExit: &agentv1.TunnelExit{Id: o.GetId(), ExitCode: code, Error: why}}})
	}
	if o.GetId() == "" || s.tunnelOf(o.GetId()) != nil {
		exit(-1, "a tunnel needs an id of its own")
		return
	}
	if why := s.refuseRoot(o.GetReservation(), o.GetRoot()); why != "" {
		exit(-1, why)
		return
	}
	tctx, cancel := context.WithCancel(ctx)
	t := &tunnel{id: o.GetId(), cancel: cancel, credit: agentv1.TunnelWindow, reservation: o.GetReservation(), root: o.GetRoot()}
	t.cond = sync.NewCond(&t.mu)
	var outs []io.Reader
	var wait func() (int32, error)
	switch o.GetKind() {
	case "exec":
		if !s.a.cfg.Exec {
			cancel()
			exit(-1, "this node runs no commands for tunnels (bcd node without --exec)")
			return
		}
		if len(o.GetArgv()) == 0 {
			cancel()
			exit(-1, "exec needs a command")
			return
		}
		cmd := exec.CommandContext(tctx, o.GetArgv()[0], o.GetArgv()[1:]...)
		cmd.Env = append(os.Environ(), "TERM=xterm-256color")
		// Ending the tunnel kills the command's whole process group (a shell's children too),
		// which a terminal's session leader leads already.
		if !o.GetTty() {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		started := func() {}
		if !o.GetRoot() {
			// A holder of part of the node: its own user, never bcd's.
			var err error
			if started, err = s.confine(o.GetReservation(), cmd); err != nil {
				cancel()
				exit(-1, err.Error())
				return
			}
		}
		var err error
		if o.GetTty() {
			t.pty, err = pty.StartWithSize(cmd, &pty.Winsize{Cols: uint16(max(o.GetCols(), 1)), Rows: uint16(max(o.GetRows(), 1))})
			t.stdin, outs = t.pty, []io.Reader{t.pty}
		} else {
			var stdout, stderr io.ReadCloser
			if t.stdin, err = cmd.StdinPipe(); err == nil {
				if stdout, err = cmd.StdoutPipe(); err == nil {
					if stderr, err = cmd.StderrPipe(); err == nil {
						outs = []io.Reader{stdout, stderr}
						err = cmd.Start()
					}
				}
			}
		}
		started()
		if err != nil {
			cancel()
			exit(-1, fmt.Sprintf("start %s: %v", o.GetArgv()[0], err))
			return
		}
		wait = func() (int32, error) {
			err := cmd.Wait()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return int32(ee.ExitCode()), nil
			}
			return 0, err
		}
	case "console":
		// The node's own consoles are its whole holder's or its operators'; an extension's (a
		// VM's) open for the reservation that owns it alone, which the extension checks.
		path, ok := s.a.cfg.Consoles[o.GetConsole()]
		if ok && !o.GetRoot() {
			cancel()
			exit(-1, fmt.Sprintf("the console %q is the node's own: a holder of part of the node may not attach to it", o.GetConsole()))
			return
		}
		if !ok {
			path, ok = s.a.exts.Console(o.GetConsole(), o.GetReservation())
		}
		if !ok {
			cancel()
			exit(-1, fmt.Sprintf("this node has no console %q", o.GetConsole()))
			return
		}
		conn, err := (&net.Dialer{}).DialContext(tctx, "unix", path)
		if err != nil {
			cancel()
			exit(-1, fmt.Sprintf("attach the console: %v", err))
			return
		}
		t.stdin, outs = conn, []io.Reader{conn}
		wait = func() (int32, error) {
			<-tctx.Done()
			conn.Close()
			return 0, nil
		}
	default:
		cancel()
		exit(-1, fmt.Sprintf("%q is not a kind of tunnel", o.GetKind()))
		return
	}
	s.mu.Lock()
	if s.tunnels == nil {
		s.tunnels = map[string]*tunnel{}
	}
	s.tunnels[t.id] = t
	s.mu.Unlock()

	s.wg.Add(1)
	go func() { // writes the holder's input, off the session's receive loop
		defer s.wg.Done()
		s.writeInput(t)
	}()
	var copies sync.WaitGroup
	for i, r := range outs {
		copies.Add(1)
		s.wg.Add(1)
		go func() { // ends when the command's output does
			defer s.wg.Done()
			defer copies.Done()
			s.pump(t, r, uint32(i+1))
			if o.GetKind() == "console" {
				t.cancel() // the console's far end went away
			}
		}()
	}
	s.wg.Add(1)
	go func() { // the tunnel's end: its exit status once its output is all sent
		defer s.wg.Done()
		// Nothing the command wrote is lost: pipes are read to their end before Wait (which
		// closes them); a pseudo-terminal is read to its end (EIO, once no process holds the
		// terminal) after.
		pipes := o.GetKind() == "exec" && !o.GetTty()
		if pipes {
			copies.Wait()
		}
		code, err := wait()
		copies.Wait()
		if t.pty != nil {
			t.pty.Close()
		}
		s.mu.Lock()
		delete(s.tunnels, t.id)
		s.mu.Unlock()
		why := ""
		switch {
		case tctx.Err() != nil && ctx.Err() == nil:
			why = "ended"
		case err != nil:
			why = err.Error()
		}
		t.end()
		exit(code, why)
	}()
}

// confine sets a holder's command up to run as its reservation's own user.
func (s *nodeSession) confine(reservation string, cmd *exec.Cmd) (func(), error) {
	switch {
	case reservation == "":
		return nil, errors.New("the control plane did not say whose command this is (a control plane older than this bcd): only its " +
			"whole holders' and operators' commands run here")
	case s.a.cfg.Confine == nil:
		return nil, errors.New("this node cannot confine a holder of part of it to its own user (bcd node runs unprivileged, or " +
			"without --exec): only a holder of the whole node, or an operator with break-glass, may run commands here")
	}
	return s.a.cfg.Confine.Confine(reservation, cmd)
}

// refuseRoot says why a root tunnel of reservation may not open: the node's desired state has
// other holders (the control plane's decision that it holds the whole node is out of date).
// An operator's (no reservation) is not refused.
func (s *nodeSession) refuseRoot(reservation string, root bool) string {
	if !root || reservation == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if shared(s.holds, reservation) {
		return fmt.Sprintf("reservation %s does not hold the whole node: other reservations hold part of it", reservation)
	}
	return ""
}

// shared reports whether ds has holders other than reservation.
func shared(ds *agentv1.DesiredState, reservation string) bool {
	for _, h := range ds.GetHolds() {
		if h.GetHolder() != reservation {
			return true
		}
	}
	return false
}

// endSharedRoot ends the root tunnels of reservations that no longer hold the whole node as ds
// says: another reservation came.
func (s *nodeSession) endSharedRoot(ds *agentv1.DesiredState) {
	s.mu.Lock()
	var ends []*tunnel
	for _, t := range s.tunnels {
		if t.root && t.reservation != "" && shared(ds, t.reservation) {
			ends = append(ends, t)
		}
	}
	s.mu.Unlock()
	for _, t := range ends {
		t.end()
	}
}

// pump sends what r gives as output of stream, within the tunnel's credit.
func (s *nodeSession) pump(t *tunnel, r io.Reader, stream uint32) {
	buf := make([]byte, tunnelChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if !t.take(int64(n)) {
				return
			}
			data := append([]byte(nil), buf[:n]...)
			if s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_TunnelOutput{TunnelOutput: &agentv1.TunnelOutput{Id: t.id, Data: data, Stream: stream}}}) != nil {
				t.end()
				return
			}
		}
		if err != nil {
			return // EOF, or EIO from a pseudo-terminal whose child is gone
		}
	}
}

// tunnelInput takes what the holder sent.
func (s *nodeSession) tunnelInput(in *agentv1.TunnelInput) {
	t := s.tunnelOf(in.GetId())
	if t == nil {
		return // ended already
	}
	switch {
	case in.GetClose():
		t.end()
		return
	case in.GetCols() > 0 && in.GetRows() > 0 && t.pty != nil:
		_ = pty.Setsize(t.pty, &pty.Winsize{Cols: uint16(in.GetCols()), Rows: uint16(in.GetRows())})
	}
	if len(in.GetData()) > 0 || in.GetEof() {
		t.queueInput(in)
	}
}

// writeInput writes the holder's input to the command as it comes, acknowledging each write:
// a command that does not read blocks this tunnel's writer alone. Input after the command
// closed its end is acknowledged and dropped.
func (s *nodeSession) writeInput(t *tunnel) {
	broken := false
	for {
		in, ok := t.nextInput()
		if !ok {
			return
		}
		if n := len(in.GetData()); n > 0 {
			if !broken {
				_, err := t.stdin.Write(in.GetData())
				broken = err != nil
			}
			if s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_TunnelAck{TunnelAck: &agentv1.TunnelAck{Id: t.id, Bytes: uint64(n)}}}) != nil {
				return
			}
		}
		if in.GetEof() && !broken {
			if t.pty != nil {
				_, _ = t.pty.Write([]byte{4}) // a terminal's end of input is ^D (at a line's start)
			} else if c, ok := t.stdin.(interface{ CloseWrite() error }); ok {
				_ = c.CloseWrite() // a console's socket: its far end may still talk
			} else {
				_ = t.stdin.Close()
			}
		}
	}
}

// endTunnels ends a session's tunnels: the holders' connections went with it.
func (s *nodeSession) endTunnels() {
	s.mu.Lock()
	ts := make([]*tunnel, 0, len(s.tunnels))
	for _, t := range s.tunnels {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	for _, t := range ts {
		t.end()
	}
}
