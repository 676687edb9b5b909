// Package wsstream carries a node session's protobuf messages over a WebSocket, the fallback of
// gRPC (agent/v1 transport.go): one message per binary WebSocket message, and the session's end
// as a close status that names a gRPC code. The gateway and the node agent both use it, each with
// its own direction of the protocol's two message types.
package wsstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/coder/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Stream sends messages of type S and receives messages of type R over a WebSocket. Send may be
// called from several goroutines at once; Recv from one at a time.
type Stream[S, R proto.Message] struct {
	conn *websocket.Conn
	ctx  context.Context // of the session: its end ends reads and writes
	new  func() R
}

// New wraps conn, whose reads and writes last as long as ctx. newR makes an empty R to read into.
func New[S, R proto.Message](ctx context.Context, conn *websocket.Conn, newR func() R) *Stream[S, R] {
	return &Stream[S, R]{conn: conn, ctx: ctx, new: newR}
}

// Send writes m as one binary message. A write the peer's close ended fails with what Recv would
// answer: a status error of the close's code, or io.EOF for a normal close.
func (s *Stream[S, R]) Send(m S) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return StatusOf(s.conn.Write(s.ctx, websocket.MessageBinary, b))
}

// Recv reads the next message. A session closed normally reads as io.EOF; one closed with a
// gRPC code (WebSocketCloseBase + code) as a gRPC status error of that code and its reason, as
// gRPC would have returned it; a text message or one that does not decode is an error of code
// InvalidArgument.
func (s *Stream[S, R]) Recv() (R, error) {
	var zero R
	typ, b, err := s.conn.Read(s.ctx)
	if err != nil {
		return zero, StatusOf(err)
	}
	if typ != websocket.MessageBinary {
		return zero, status.Error(codes.InvalidArgument, "a session's WebSocket messages are binary protobuf")
	}
	m := s.new()
	if err := proto.Unmarshal(b, m); err != nil {
		return zero, status.Errorf(codes.InvalidArgument, "a session message that does not decode: %v", err)
	}
	return m, nil
}

// Close ends the stream with the close status of err (nil: a normal end), which the peer reads
// back with StatusOf. It waits a few seconds at most for the peer to acknowledge.
func (s *Stream[S, R]) Close(err error) error {
	code, reason := CloseStatus(err)
	return s.conn.Close(code, reason)
}

// CloseNow ends the stream without the close handshake.
func (s *Stream[S, R]) CloseNow() error { return s.conn.CloseNow() }

// maxReason is what a close frame holds of a reason (125 bytes less the status's two).
const maxReason = 123

// CloseStatus is the close status and reason that convey err: 1000 for nil, else
// WebSocketCloseBase plus its gRPC code (Unknown for an error that has none) and its message,
// cut to what a close frame holds.
func CloseStatus(err error) (websocket.StatusCode, string) {
	if err == nil {
		return websocket.StatusNormalClosure, ""
	}
	st, _ := status.FromError(err)
	code, msg := st.Code(), st.Message()
	if code == codes.OK {
		code = codes.Unknown
	}
	if len(msg) > maxReason {
		msg = msg[:maxReason]
		for !utf8.ValidString(msg) {
			msg = msg[:len(msg)-1]
		}
	}
	return websocket.StatusCode(agentv1.WebSocketCloseBase + int(code)), msg
}

// StatusOf turns the error of a read or write into what gRPC would have said: io.EOF for a
// normal close, a status error for a close that names a gRPC code, err itself otherwise.
func StatusOf(err error) error {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return err
	}
	if ce.Code == websocket.StatusNormalClosure {
		return io.EOF
	}
	if c := int(ce.Code) - agentv1.WebSocketCloseBase; c > 0 && c <= int(codes.Unauthenticated) {
		return status.Error(codes.Code(c), ce.Reason)
	}
	return fmt.Errorf("the session's WebSocket closed: %w", err)
}
