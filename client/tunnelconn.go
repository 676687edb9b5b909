package client

import (
	"context"
	"errors"
	"io"
	"net"
	"time"
)

// NetConn returns the tunnel as a net.Conn: what it reads is the tunnel's output, what it writes
// the tunnel's input. It carries a protocol spoken over a console, such as SSH to a sandbox on
// its second serial port (docs/sandboxes.md). It has no deadlines (setting one answers
// ErrTunnelDeadline): end it with ctx or Close.
func (t *Tunnel) NetConn(ctx context.Context) net.Conn {
	r, w := io.Pipe()
	go func() {
		_, err := t.Wait(ctx, w, nil)
		if err == nil {
			err = io.EOF
		}
		w.CloseWithError(err)
	}()
	return &tunnelConn{t: t, r: r}
}

type tunnelConn struct {
	t *Tunnel
	r *io.PipeReader
}

func (c *tunnelConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *tunnelConn) Write(p []byte) (int, error) { return c.t.Write(p) }
func (c *tunnelConn) Close() error {
	c.r.Close()
	return c.t.Close()
}

type tunnelAddr struct{}

func (tunnelAddr) Network() string { return "tunnel" }
func (tunnelAddr) String() string  { return "tunnel" }

func (c *tunnelConn) LocalAddr() net.Addr  { return tunnelAddr{} }
func (c *tunnelConn) RemoteAddr() net.Addr { return tunnelAddr{} }

// ErrTunnelDeadline is a deadline set on a tunnel's net.Conn: it has none (it would have been
// ignored), so its holder ends it with the context that made it, or Close.
var ErrTunnelDeadline = errors.New("client: a tunnel's connection has no deadlines; end it with its context or Close")

// deadline accepts clearing a deadline (nothing to clear) and refuses setting one.
func deadline(t time.Time) error {
	if t.IsZero() {
		return nil
	}
	return ErrTunnelDeadline
}

func (c *tunnelConn) SetDeadline(t time.Time) error      { return deadline(t) }
func (c *tunnelConn) SetReadDeadline(t time.Time) error  { return deadline(t) }
func (c *tunnelConn) SetWriteDeadline(t time.Time) error { return deadline(t) }
