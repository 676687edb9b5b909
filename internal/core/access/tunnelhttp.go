package access

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/internal/core/gateway"
	"github.com/better-compute/compute/postgres"
)

// tunnelPing is how often an open tunnel pings its holder: one that stops answering (its
// network gone) ends the tunnel instead of holding the command open.
const tunnelPing = 30 * time.Second

// maxTunnelFrame bounds one message from the holder.
const maxTunnelFrame = 64 << 10

// IsTunnel reports whether r is for a tunnel, however the API's handler is mounted.
func IsTunnel(r *http.Request) bool {
	return strings.TrimPrefix(r.URL.Path, api.BasePath) == api.TunnelPath
}

// TunnelHandler serves the tunnels of this process's gateway: see serveTunnel.
func TunnelHandler(db *postgres.DB, gw *gateway.Gateway, log *slog.Logger) http.Handler {
	return &tunnelHandler{db: db, gw: gw, log: log}
}

type tunnelHandler struct {
	db  *postgres.DB
	gw  *gateway.Gateway
	log *slog.Logger
}

func (h *tunnelHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serveTunnel(w, r) }

// serveTunnel serves GET BasePath/access/tunnel?ticket=…: it spends the ticket (its decision was
// access.exec's or access.console's), opens the tunnel over the node's session and carries it
// as a WebSocket (api.FrameData and the rest) until the command exits, the holder goes, or the
// reservation no longer holds the node.
func (h *tunnelHandler) serveTunnel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		envelope.WriteError(w, http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument,
			Message: r.Method + " is not allowed: a tunnel is GET " + api.BasePath + api.TunnelPath + "?ticket=…", Details: map[string]any{"reason": "method_not_allowed"}})
		return
	}
	t, err := SpendTicket(r.Context(), h.db, r.URL.Query().Get("ticket"))
	if errors.Is(err, ErrTicket) {
		envelope.WriteError(w, 0, &api.Error{Code: api.CodeUnauthenticated, Message: err.Error() + "; ask access.exec or access.console for another",
			Details: map[string]any{"reason": "ticket"}})
		return
	}
	if err != nil {
		h.log.Error("tunnel: spend the ticket", "err", err)
		envelope.WriteError(w, 0, err)
		return
	}
	// An operator's break-glass by a reservation is the operator's root, not the holder's: the
	// node would refuse it as a whole holder's on the shared node it is for, and end it when
	// another reservation comes. The gateway still ends it with the reservation's hold.
	holder := t.Reservation
	if t.BreakGlass {
		holder = ""
	}
	open := &agentv1.TunnelOpen{Id: uuid.Must(uuid.NewV7()).String(), Kind: t.Kind, Argv: t.Argv, Tty: t.TTY,
		Cols: uint32(t.Cols), Rows: uint32(t.Rows), Console: t.Console, Reservation: holder, Root: t.Root}
	tun, err := h.gw.OpenTunnel(r.Context(), t.Node, t.Reservation, open)
	if errors.Is(err, gateway.ErrNoSession) {
		envelope.WriteError(w, 0, &api.Error{Code: api.CodeUnavailable,
			Message: "node " + t.Node + " has no session with this process's gateway (it is offline, or connected to another process)",
			Details: map[string]any{"reason": "no_session", "node": t.Node}})
		return
	}
	if err != nil {
		envelope.WriteError(w, 0, err)
		return
	}
	defer tun.Close()
	// A server's timeouts (the devserver's WriteTimeout is 60 s) would cut a tunnel: the
	// WebSocket keeps its own pings instead.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	// The ticket is the credential, not a cookie: a page of any origin holding one may open it.
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered the request
	}
	defer ws.CloseNow()
	ws.SetReadLimit(maxTunnelFrame)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go tunnelInput(ctx, cancel, ws, tun)
	go func() {
		tick := time.NewTicker(tunnelPing)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				pctx, done := context.WithTimeout(ctx, tunnelPing/2)
				err := ws.Ping(pctx)
				done()
				if err != nil {
					cancel()
					return
				}
			}
		}
	}()
	for {
		out, exit, err := tun.Next(ctx)
		if err != nil {
			return // the holder went: tun.Close kills the command
		}
		if exit != nil {
			b, _ := json.Marshal(api.TunnelExit{ExitCode: int(exit.GetExitCode()), Error: exit.GetError()})
			if ws.Write(ctx, websocket.MessageBinary, append([]byte{api.FrameExit}, b...)) == nil {
				ws.Close(websocket.StatusNormalClosure, "")
			}
			return
		}
		frame := api.FrameData
		if out.GetStream() == 2 {
			frame = api.FrameStderr
		}
		if err := ws.Write(ctx, websocket.MessageBinary, append([]byte{frame}, out.GetData()...)); err != nil {
			return
		}
	}
}

// tunnelInput carries the holder's frames to the node until the holder goes (then cancel). Once
// the tunnel has ended it reads on and drops what comes, so that the close handshake completes
// and the exit is not lost to a reset.
func tunnelInput(ctx context.Context, cancel context.CancelFunc, ws *websocket.Conn, tun *gateway.Tunnel) {
	defer cancel()
	ended := false
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageBinary || len(b) == 0 {
			ws.Close(websocket.StatusUnsupportedData, "tunnel frames are binary: a type byte, then its payload")
			return
		}
		if ended {
			continue
		}
		var in agentv1.TunnelInput
		switch b[0] {
		case api.FrameData:
			in.Data = b[1:]
		case api.FrameEOF:
			in.Eof = true
		case api.FrameResize:
			var sz api.TunnelSize
			if err := json.Unmarshal(b[1:], &sz); err != nil || sz.Cols < 1 || sz.Rows < 1 || sz.Cols > 10000 || sz.Rows > 10000 {
				ws.Close(websocket.StatusInvalidFramePayloadData, `a resize is {"cols":1-10000,"rows":1-10000}`)
				return
			}
			in.Cols, in.Rows = uint32(sz.Cols), uint32(sz.Rows)
		default:
			ws.Close(websocket.StatusUnsupportedData, "unknown tunnel frame type")
			return
		}
		ended = !tun.Input(ctx, &in)
	}
}
