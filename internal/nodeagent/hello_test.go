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
	for _, tc := range []struct {
		name            string
		sendErr, recv   error
		retired, isBare bool
	}{
		{"revoked", io.EOF, status.Error(codes.PermissionDenied, "the node's certificate is revoked"), true, false},
		{"not running", io.EOF, status.Error(codes.Unavailable, "gateway: not running"), false, false},
		{"a broken connection", errors.New("connection reset"), nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &endedStream{sendErr: tc.sendErr, recvErr: tc.recv}
			s := &nodeSession{st: st}
			_, err := s.hello(&agentv1.Hello{AgentVersion: "test"})
			err = s.classify(err)
			if got := errors.Is(err, ErrRetired); got != tc.retired {
				t.Errorf("retired = %v (%v), want %v", got, err, tc.retired)
			}
			if tc.isBare && !errors.Is(err, tc.sendErr) {
				t.Errorf("a send that failed otherwise = %v, want its own error", err)
			}
			if !tc.isBare && status.Code(err) != status.Code(tc.recv) && !errors.Is(err, ErrRetired) {
				t.Errorf("error %v, want the gateway's %v", err, tc.recv)
			}
			if st.sent != 1 {
				t.Errorf("%d sends, want the hello once", st.sent)
			}
		})
	}
}
