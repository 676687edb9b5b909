package compat

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/compute"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/wsstream"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/sim"
)

// future adds to m a field of number n that this tree's protocol does not have, as a later
// version's message would carry: a new member of a oneof (a message kind) when m is
// NodeMessage or ServerMessage, a new field otherwise.
func future(m proto.Message, n protowire.Number) {
	b := protowire.AppendTag(nil, n, protowire.BytesType)
	b = protowire.AppendString(b, "from a later version")
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), b...))
}

// TestAFutureGatewayIsUnderstood: this tree's node agent, against a gateway of a later protocol
// that sends it a message kind it does not know and fields it does not know in the messages it
// does, ignores what it does not know and does the rest: it applies the desired state and
// answers the command. The gateway is played by the test, over the WebSocket transport, with a
// certificate of the real machine CA; the node joins through the real JoinService.
func TestAFutureGatewayIsUnderstood(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	url := env.Server(t)
	if _, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	tok, err := env.Compute.API.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	type heard struct {
		ack    *agentv1.DesiredStateAck
		result *agentv1.CommandResult
		err    error
	}
	got := make(chan heard, 16)
	mux := http.NewServeMux()
	mux.HandleFunc(agentv1.SessionWebSocketPath, func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{agentv1.SessionWebSocketProtocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		st := wsstream.New[*agentv1.ServerMessage](r.Context(), c, func() *agentv1.NodeMessage { return &agentv1.NodeMessage{} })
		hello, err := st.Recv()
		if err != nil || hello.GetHello() == nil {
			got <- heard{err: err}
			return
		}
		node := r.TLS.PeerCertificates[0]
		welcome := &agentv1.Welcome{NodeId: node.Subject.CommonName, Epoch: 1, HeartbeatInterval: durationpb.New(time.Second)}
		future(welcome, 9)
		kind := &agentv1.ServerMessage{}
		future(kind, 50) // a message kind of a later version
		hold := &agentv1.DeviceHold{Holder: "r-1", Gpus: []*agentv1.HeldGPU{{Index: 0, Uuid: "GPU-fake-future-0-0", Share: -1}}}
		future(hold, 9)
		ds := &agentv1.DesiredState{Generation: 7, Holds: []*agentv1.DeviceHold{hold}}
		future(ds, 50)
		cmd := &agentv1.Command{Id: "c-1", Kind: "health.check", Deadline: timestamppb.New(time.Now().Add(time.Minute))}
		future(cmd, 50)
		for _, m := range []*agentv1.ServerMessage{
			{Body: &agentv1.ServerMessage_Welcome{Welcome: welcome}},
			kind,
			{Body: &agentv1.ServerMessage_Desired{Desired: ds}},
			{Body: &agentv1.ServerMessage_Command{Command: cmd}},
		} {
			if err := st.Send(m); err != nil {
				got <- heard{err: err}
				return
			}
		}
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			switch {
			case m.GetAck() != nil:
				got <- heard{ack: m.GetAck()}
			case m.GetAttested() != nil:
				var body agentv1.AttestedBody
				if err := proto.Unmarshal(m.GetAttested().GetBody(), &body); err == nil && body.GetResult() != nil {
					got <- heard{result: body.GetResult()}
				}
			}
		}
	})
	cfg, err := env.Compute.GatewayTLS(ctx, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })

	f, err := sim.Start(ctx, sim.Options{URL: url, Token: tok.Token, Gateway: ln.Addr().String(), Transport: nodeagent.TransportWebSocket, Nodes: 1, Prefix: "future"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	var ack *agentv1.DesiredStateAck
	var result *agentv1.CommandResult
	for ack == nil || result == nil {
		select {
		case h := <-got:
			if h.err != nil {
				t.Fatalf("the session: %v", h.err)
			}
			ack, result = cmpOr(h.ack, ack), cmpOr(h.result, result)
		case <-time.After(30 * time.Second):
			t.Fatalf("after 30s: ack %v, result %v; the node: %+v", ack, result, f.Nodes[0].Status())
		}
	}
	if ack.GetGeneration() != 7 || ack.GetError() != "" || result.GetCommandId() != "c-1" || !result.GetOk() {
		t.Fatalf("ack %v, result %v", ack, result)
	}
	if holds := f.Nodes[0].Converger.Last().GetHolds(); len(holds) != 1 || holds[0].GetHolder() != "r-1" {
		t.Fatalf("the node converged on %v", holds)
	}
	if st := f.Nodes[0].Status(); !st.Connected || st.Sessions != 1 {
		t.Fatalf("the session did not survive what it did not know: %+v", st)
	}
}

func cmpOr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// TestAFutureNodeIsUnderstood: this tree's gateway, facing a node of a later protocol that
// sends a message kind it does not know and fields it does not know in a hello and heartbeats,
// ignores them and keeps the session: the hello is welcomed, the heartbeats answered.
func TestAFutureNodeIsUnderstood(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 200 * time.Millisecond }})
	ctx := context.Background()
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	if _, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "h100"}); err != nil {
		t.Fatal(err)
	}
	tok, err := env.Compute.API.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "h100"})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, csr, err := nodeagent.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	req := &agentv1.JoinRequest{Token: tok.Token, CsrDer: csr, Facts: &agentv1.MachineFacts{Hostname: "later", MachineId: "machine-later"}}
	future(req.Facts, 20) // a fact a later agent reports
	resp, err := agentv1connect.NewJoinServiceClient(http.DefaultClient, url).Join(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("a later agent's join: %v", err)
	}
	key, _ := x509.ParsePKCS8PrivateKey(keyDER)
	roots := x509.NewCertPool()
	for _, der := range resp.Msg.GetCaCertificatesDer() {
		c, _ := x509.ParseCertificate(der)
		roots.AddCert(c)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots,
		Certificates: []tls.Certificate{{Certificate: [][]byte{resp.Msg.GetCertificateDer()}, PrivateKey: key}}}
	conn, err := grpc.NewClient(gw, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var st grpc.BidiStreamingClient[agentv1.NodeMessage, agentv1.ServerMessage]
	var first *agentv1.ServerMessage
	computetest.Eventually(t, 30*time.Second, "the later node welcomed", func() bool { // the gateway starts asynchronously
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		if st, err = agentv1.NewSessionServiceClient(conn).Connect(sctx); err != nil {
			return false
		}
		hello := &agentv1.Hello{AgentVersion: "later"}
		future(hello, 9)
		if st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Hello{Hello: hello}}) != nil {
			return false
		}
		first, err = st.Recv()
		return err == nil && first.GetWelcome() != nil
	})
	kind := &agentv1.NodeMessage{}
	future(kind, 50)
	hb := &agentv1.Heartbeat{}
	future(hb, 9)
	for range 3 {
		for _, m := range []*agentv1.NodeMessage{kind, {Body: &agentv1.NodeMessage_Heartbeat{Heartbeat: hb}}} {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("the session ended: %v", err)
			}
			if m.GetHeartbeatAck() != nil {
				break
			}
		}
	}
	list, err := env.Compute.API.Nodes.List(ctx, env.RootKey, api.ListNodes{Pool: "h100"})
	if err != nil || len(list.Items) != 1 || list.Items[0].Status != api.NodeOnline {
		t.Fatalf("the later node: %+v, %v", list, err)
	}
}
