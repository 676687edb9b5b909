package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
)

type nodeKey struct{}

// MaxMessageBytes bounds one message of a node's session.
const MaxMessageBytes = 4 << 20

// Handler serves SessionService with Connect (which speaks gRPC) as an http.Handler, and the
// same sessions over a WebSocket at agentv1.SessionWebSocketPath (HTTP/1.1), for a server with
// TLS whose client certificates are verified against the machine CA (see
// pki.Authority.ServerTLS). The node is identified by its certificate, on either path.
func (g *Gateway) Handler() http.Handler {
	// Bounded messages: an inventory of many GPUs is a few kilobytes.
	path, h := agentv1connect.NewSessionServiceHandler(connectSessions{g}, connect.WithReadMaxBytes(MaxMessageBytes))
	mux := http.NewServeMux()
	mux.Handle(path, withNode(func(w http.ResponseWriter, r *http.Request, cert *x509.Certificate) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nodeKey{}, cert)))
	}))
	mux.Handle(agentv1.SessionWebSocketPath, withNode(g.serveWebSocket))
	return mux
}

// withNode refuses a request without a client certificate (one the TLS stack verified against
// the machine CA) and hands the certificate to serve.
func withNode(serve func(http.ResponseWriter, *http.Request, *x509.Certificate)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "a node session needs a client certificate from the machine CA", http.StatusUnauthorized)
			return
		}
		serve(w, r, r.TLS.PeerCertificates[0])
	})
}

type connectSessions struct{ g *Gateway }

func (c connectSessions) Connect(ctx context.Context, bs *connect.BidiStream[agentv1.NodeMessage, agentv1.ServerMessage]) error {
	cert, _ := ctx.Value(nodeKey{}).(*x509.Certificate)
	if cert == nil {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("no node certificate"))
	}
	return c.g.Serve(ctx, cert, connectStream{bs})
}

type connectStream struct {
	bs *connect.BidiStream[agentv1.NodeMessage, agentv1.ServerMessage]
}

func (s connectStream) Send(m *agentv1.ServerMessage) error { return s.bs.Send(m) }
func (s connectStream) Recv() (*agentv1.NodeMessage, error) { return s.bs.Receive() }

// Register registers SessionService on a host's grpc.Server, which must use TLS credentials that
// verify client certificates against the machine CA (pki.Authority.ServerTLS).
func (g *Gateway) Register(s grpc.ServiceRegistrar) {
	agentv1.RegisterSessionServiceServer(s, grpcSessions{g: g})
}

type grpcSessions struct {
	agentv1.UnimplementedSessionServiceServer
	g *Gateway
}

func (s grpcSessions) Connect(st grpc.BidiStreamingServer[agentv1.NodeMessage, agentv1.ServerMessage]) error {
	p, ok := peer.FromContext(st.Context())
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return status.Error(codes.Unauthenticated, "a node session needs a client certificate from the machine CA")
	}
	err := s.g.Serve(st.Context(), info.State.PeerCertificates[0], st)
	var ce *connect.Error
	if errors.As(err, &ce) {
		// The same codes as over Connect: permission denied is final for the node.
		return status.Error(codes.Code(ce.Code()), ce.Message())
	}
	return err
}
