package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/better-compute/compute/api"
)

// Tunnel is an open tunnel to a node: a command run there, or its console (docs/access.md).
// Write sends standard input; Run carries a whole session. A Tunnel is safe for one reader and
// one writer at a time.
type Tunnel struct {
	ws *websocket.Conn
	wm sync.Mutex // one frame at a time
}

// Exec asks for a ticket (access.exec) and opens its tunnel.
func (c *Client) Exec(ctx context.Context, in api.OpenTunnel) (*Tunnel, error) {
	t, err := c.Access.Exec(ctx, in)
	if err != nil {
		return nil, err
	}
	return c.OpenTunnel(ctx, t)
}

// Console asks for a ticket (access.console) and opens its tunnel.
func (c *Client) Console(ctx context.Context, in api.OpenTunnel) (*Tunnel, error) {
	t, err := c.Access.Console(ctx, in)
	if err != nil {
		return nil, err
	}
	return c.OpenTunnel(ctx, t)
}

// OpenTunnel opens the tunnel of a ticket; a ticket opens one tunnel, once, within a minute.
func (c *Client) OpenTunnel(ctx context.Context, t api.TunnelTicket) (*Tunnel, error) {
	u := c.base + t.URL
	switch {
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	h := *c.http
	h.Timeout = 0 // a tunnel outlives any request timeout
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: &h, HTTPHeader: map[string][]string{"User-Agent": {c.agent}}})
	if err != nil {
		if resp != nil && resp.Body != nil {
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
			return nil, answerError("the tunnel", resp, raw)
		}
		return nil, &netError{fmt.Errorf("the tunnel: %w", err)}
	}
	ws.SetReadLimit(1 << 20)
	return &Tunnel{ws: ws}, nil
}

func (t *Tunnel) send(ctx context.Context, frame byte, p []byte) error {
	t.wm.Lock()
	defer t.wm.Unlock()
	return t.ws.Write(ctx, websocket.MessageBinary, append([]byte{frame}, p...))
}

// Write sends p to the command's standard input (or the console).
func (t *Tunnel) Write(p []byte) (int, error) {
	sent := 0
	for sent < len(p) {
		n := min(len(p)-sent, 32<<10)
		if err := t.send(context.Background(), api.FrameData, p[sent:sent+n]); err != nil {
			return sent, err
		}
		sent += n
	}
	return sent, nil
}

// CloseInput ends the command's standard input.
func (t *Tunnel) CloseInput() error { return t.send(context.Background(), api.FrameEOF, nil) }

// Resize tells the command's terminal its new size.
func (t *Tunnel) Resize(ctx context.Context, cols, rows int) error {
	b, _ := json.Marshal(api.TunnelSize{Cols: cols, Rows: rows})
	return t.send(ctx, api.FrameResize, b)
}

// Close ends the tunnel: the node ends its command.
func (t *Tunnel) Close() error { return t.ws.Close(websocket.StatusNormalClosure, "") }

// ErrTunnelLost is a tunnel that ended without its exit: the connection broke.
var ErrTunnelLost = errors.New("client: the tunnel ended without an exit")

// Wait copies the command's output to stdout and stderr (stderr nil: to stdout) until it exits,
// and returns its exit: ExitCode, or -1 with Error saying why the tunnel ended without one.
func (t *Tunnel) Wait(ctx context.Context, stdout, stderr io.Writer) (api.TunnelExit, error) {
	if stderr == nil {
		stderr = stdout
	}
	for {
		_, b, err := t.ws.Read(ctx)
		if err != nil {
			return api.TunnelExit{}, fmt.Errorf("%w: %w", ErrTunnelLost, err)
		}
		if len(b) == 0 {
			continue
		}
		switch b[0] {
		case api.FrameData:
			_, err = stdout.Write(b[1:])
		case api.FrameStderr:
			_, err = stderr.Write(b[1:])
		case api.FrameExit:
			var e api.TunnelExit
			if err := json.Unmarshal(b[1:], &e); err != nil {
				return e, fmt.Errorf("client: decode the tunnel's exit: %w", err)
			}
			t.ws.Close(websocket.StatusNormalClosure, "")
			return e, nil
		}
		if err != nil {
			t.ws.Close(websocket.StatusNormalClosure, "")
			return api.TunnelExit{}, err
		}
	}
}

// Run carries a whole session: stdin (nil: none) is sent, then its end, while the output goes to
// stdout and stderr, until the command exits.
func (t *Tunnel) Run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (api.TunnelExit, error) {
	if stdin != nil {
		go func() {
			if _, err := io.Copy(t, stdin); err == nil {
				_ = t.CloseInput()
			}
		}()
	} else if err := t.CloseInput(); err != nil {
		return api.TunnelExit{}, err
	}
	return t.Wait(ctx, stdout, stderr)
}
