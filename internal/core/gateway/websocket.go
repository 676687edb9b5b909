package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/lib/wsstream"
)

// serveWebSocket runs a node's session over a WebSocket (agentv1.SessionWebSocketPath), the
// fallback for where gRPC cannot get through: the same Serve as over gRPC, for the node that
// cert names (verified by the TLS stack, as for gRPC), with one protobuf message per binary
// WebSocket message. A refusal or an error of the session service closes the WebSocket with
// WebSocketCloseBase plus its gRPC code, which the node reads as gRPC would have said it.
func (g *Gateway) serveWebSocket(w http.ResponseWriter, r *http.Request, cert *x509.Certificate) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{agentv1.SessionWebSocketProtocol}})
	if err != nil {
		return // Accept answered the request
	}
	defer c.CloseNow()
	if c.Subprotocol() != agentv1.SessionWebSocketProtocol {
		_ = c.Close(websocket.StatusPolicyViolation, "a node session needs the subprotocol "+agentv1.SessionWebSocketProtocol)
		return
	}
	c.SetReadLimit(MaxMessageBytes)
	// The request's context is not ended by the connection's end once it is hijacked: the
	// stream's reads and writes fail then instead, which ends Serve.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st := wsstream.New[*agentv1.ServerMessage](ctx, c, func() *agentv1.NodeMessage { return &agentv1.NodeMessage{} })
	err = g.Serve(ctx, cert, st)
	var ce *connect.Error
	if errors.As(err, &ce) {
		err = status.Error(codes.Code(ce.Code()), ce.Message())
	}
	_ = st.Close(err)
}
