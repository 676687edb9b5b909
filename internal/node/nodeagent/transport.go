package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/lib/wsstream"
)

// Transports of a session: how the node reaches its gateway. Either carries the same session
// (agent/v1), over the same mutual TLS.
const (
	// TransportAuto is gRPC, falling back to the WebSocket when gRPC cannot open its stream.
	TransportAuto = "auto"
	// TransportGRPC is gRPC over HTTP/2 only.
	TransportGRPC = "grpc"
	// TransportWebSocket is the WebSocket (HTTP/1.1) only.
	TransportWebSocket = "websocket"
)

// ValidTransport reports whether t names a transport ("" is TransportAuto).
func ValidTransport(t string) bool {
	return t == "" || t == TransportAuto || t == TransportGRPC || t == TransportWebSocket
}

// WebSocketStickiness is how long a node in auto mode keeps to the WebSocket once gRPC failed
// and the WebSocket opened: its reconnects within it try the WebSocket first, the first after it
// gRPC again, so that a path that lets HTTP/2 through again is used again within about that.
const WebSocketStickiness = time.Hour

// dialTimeout bounds the WebSocket's connection, TLS handshake and upgrade; gRPC's own
// connection attempt gives up after 20 seconds.
const dialTimeout = 15 * time.Second

// stream is a session's stream over either transport.
type stream interface {
	Send(*agentv1.NodeMessage) error
	Recv() (*agentv1.ServerMessage, error)
	close()
}

// dial opens a session's stream to addr with the transport the configuration asks for.
//
// The rule of auto: gRPC first; when its stream cannot be opened at all (no HTTP/2 connection
// became ready: the TCP connection or the TLS handshake failed, ALPN did not select h2, the
// connection was cut, HTTP/2's preface was refused: what a middlebox that lets only HTTP/1.1
// through does), the WebSocket at once, at the same address. Once the WebSocket opened after
// gRPC failed so, reconnects try the WebSocket first (then gRPC) for WebSocketStickiness. An
// answer of the session service over either transport (a refusal, an error, a goodbye) is never
// a reason to change transports: only a stream that could not be opened is.
func (a *Agent) dial(ctx context.Context, addr string, tc *tls.Config) (stream, string, error) {
	order := []string{TransportGRPC, TransportWebSocket}
	switch a.cfg.Transport {
	case TransportGRPC, TransportWebSocket:
		order = []string{a.cfg.Transport}
	default:
		a.mu.Lock()
		sticky := time.Now().Before(a.wsUntil)
		a.mu.Unlock()
		if sticky {
			order = []string{TransportWebSocket, TransportGRPC}
		}
	}
	var errs []error
	for i, t := range order {
		var st stream
		var err error
		if t == TransportGRPC {
			st, err = dialGRPC(ctx, addr, tc)
		} else {
			st, err = dialWebSocket(ctx, addr, tc)
		}
		if err == nil {
			if t == TransportWebSocket && len(order) > 1 && i > 0 {
				a.mu.Lock()
				a.wsUntil = time.Now().Add(WebSocketStickiness)
				a.mu.Unlock()
			}
			return st, t, nil
		}
		if t == TransportWebSocket && len(order) > 1 {
			a.mu.Lock()
			a.wsUntil = time.Time{}
			a.mu.Unlock()
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		if i+1 < len(order) {
			a.cfg.Logger.Warn("nodeagent: could not open the session over "+t+"; trying "+order[i+1], "gateway", addr, "error", err)
		}
	}
	return nil, "", errors.Join(errs...)
}

// dialGRPC opens the session's stream over gRPC. Opening it fails only when no HTTP/2
// connection to the gateway became ready: the gateway's answers come on the stream.
func dialGRPC(ctx context.Context, addr string, tc *tls.Config) (stream, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return nil, fmt.Errorf("nodeagent: dial %s: %w", addr, err)
	}
	st, err := agentv1.NewSessionServiceClient(conn).Connect(ctx)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("nodeagent: connect to %s over gRPC: %w", addr, err)
	}
	return grpcStream{st, conn}, nil
}

type grpcStream struct {
	grpc.BidiStreamingClient[agentv1.NodeMessage, agentv1.ServerMessage]
	conn *grpc.ClientConn
}

func (s grpcStream) close() { s.conn.Close() }

// dialWebSocket opens the session's stream over a WebSocket: HTTP/1.1 only (ALPN http/1.1),
// through the proxy the environment names (HTTPS_PROXY, as gRPC's dialer does), the node's
// certificate presented to the gateway itself inside the tunnel.
func dialWebSocket(ctx context.Context, addr string, tc *tls.Config) (stream, error) {
	tc = tc.Clone()
	tc.NextProtos = []string{"http/1.1"}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: dialTimeout,
	}
	c, _, err := websocket.Dial(ctx, "wss://"+addr+agentv1.SessionWebSocketPath, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr}, Subprotocols: []string{agentv1.SessionWebSocketProtocol}})
	if err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("nodeagent: connect to %s over a WebSocket: %w", addr, err)
	}
	if c.Subprotocol() != agentv1.SessionWebSocketProtocol {
		c.CloseNow()
		return nil, fmt.Errorf("nodeagent: connect to %s over a WebSocket: the server does not speak %s", addr, agentv1.SessionWebSocketProtocol)
	}
	c.SetReadLimit(maxMessageBytes)
	return wsStream{wsstream.New[*agentv1.NodeMessage](ctx, c, func() *agentv1.ServerMessage { return &agentv1.ServerMessage{} })}, nil
}

// maxMessageBytes bounds a message from the gateway, as gRPC's default receive limit does.
const maxMessageBytes = 4 << 20

type wsStream struct {
	*wsstream.Stream[*agentv1.NodeMessage, *agentv1.ServerMessage]
}

func (s wsStream) close() { _ = s.CloseNow() }
