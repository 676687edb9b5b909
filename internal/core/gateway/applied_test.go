package gateway_test

import (
	"testing"
	"time"

	"github.com/better-compute/compute"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/computetest"
)

// TestAppliedErrorOutlivesHeartbeats: a node's report that it could not apply its desired state
// stands until it acknowledges another state; its heartbeats, which carry only the generation it
// applied, do not erase it (they did, within a flush).
func TestAppliedErrorOutlivesHeartbeats(t *testing.T) {
	t.Parallel()
	// The raw session beats only when the test says: a grace of seconds, not fast's, keeps a
	// loaded machine's slow first push from ending it.
	p := newPlane(t, func(o *compute.Options) { o.HeartbeatInterval = 2 * time.Second })
	n := p.rawSession(t, "raw-applied")
	m, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetDesired() != nil })
	if err != nil {
		t.Fatal(err)
	}
	gen := m.GetDesired().GetGeneration()
	if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Ack{Ack: &agentv1.DesiredStateAck{Generation: gen, Error: "no extension converges kind x"}}}); err != nil {
		t.Fatal(err)
	}
	failed := func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_desired WHERE node_id = $1 AND applied_error = 'no extension converges kind x'`, n.id) == 1
	}
	computetest.Eventually(t, patience, "the error recorded", failed)
	var seen time.Time
	if err := p.DB.Pool.QueryRow(p.ctx, `SELECT last_seen_at FROM compute.node_sessions WHERE node_id = $1`, n.id).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	n.heartbeat(t)
	computetest.Eventually(t, patience, "the heartbeat flushed", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_sessions WHERE node_id = $1 AND last_seen_at > $2`, n.id, seen) == 1
	})
	if !failed() {
		t.Fatal("a heartbeat erased the node's error")
	}
	// The next acknowledgement, without an error, clears it.
	if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Ack{Ack: &agentv1.DesiredStateAck{Generation: gen}}}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the error cleared", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.node_desired WHERE node_id = $1 AND applied_error = ''`, n.id) == 1
	})
}
