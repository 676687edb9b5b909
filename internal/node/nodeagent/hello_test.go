package nodeagent

import (
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// endedStream is a session stream the gateway already ended with an error before the node sent
// anything: as gRPC's client stream does then, a send fails with io.EOF and a receive answers
// the gateway's status.
type endedStream struct {
	sendErr, recvErr error
	sent             int
}

func (s *endedStream) Send(*agentv1.NodeMessage) error { s.sent++; return s.sendErr }
func (s *endedStream) Recv() (*agentv1.ServerMessage, error) {
	return nil, s.recvErr
}
func (s *endedStream) close() {}

// TestARefusalBeforeTheHelloIsTheSessionsError: a gateway that refuses a session before reading
// its hello (a revoked certificate) is heard as the refusal it sent, not as the send's io.EOF: a
// retired node must stop, not reconnect forever. (The hello's io.EOF was the session's error.)
func TestARefusalBeforeTheHelloIsTheSessionsError(t *testing.T) {
	t.Parallel()
	reset := errors.New("connection reset")
	for _, tc := range []struct {
		name          string
		sendErr, recv error
		want          func(error) bool
	}{
		{"revoked", io.EOF, status.Error(codes.PermissionDenied, "the node's certificate is revoked"),
			func(err error) bool { return errors.Is(err, ErrRetired) }},
		{"not running", io.EOF, status.Error(codes.Unavailable, "gateway: not running"),
			func(err error) bool { return status.Code(err) == codes.Unavailable && !errors.Is(err, ErrRetired) }},
		{"a broken connection", reset, nil,
			func(err error) bool { return errors.Is(err, reset) && !errors.Is(err, ErrRetired) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &endedStream{sendErr: tc.sendErr, recvErr: tc.recv}
			s := &nodeSession{st: st}
			_, err := s.hello(&agentv1.Hello{AgentVersion: "test"})
			if err = s.classify(err); !tc.want(err) {
				t.Errorf("the session's error = %v", err)
			}
			if st.sent != 1 {
				t.Errorf("%d sends, want the hello once", st.sent)
			}
		})
	}
}
