package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/better-compute/compute"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// slow gives nodes a grace period (3 × 5 s and two flushes) far longer than what the tests of
// closed sessions wait, so only the close can have taken a node offline.
func slow(o *compute.Options) { o.HeartbeatInterval = 5 * time.Second }

func (p *plane) status(t *testing.T, node string) string {
	t.Helper()
	n, err := p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status
}

// metric reads a series of this control plane's /metrics, 0 when it is absent: a gauge's value, or
// a histogram's count of observations.
func (p *plane) metric(t *testing.T, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	p.Compute.MetricsHandler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	ms := fams[name].GetMetric()
	if len(ms) == 0 {
		return 0
	}
	if h := ms[0].GetHistogram(); h != nil {
		return float64(h.GetSampleCount())
	}
	return ms[0].GetGauge().GetValue()
}

// TestClosedSessionTakesItsNodeOfflineAtOnce: a node whose agent stops is offline in about a
// second, not after its grace period, with a node.offline event; the rest of the fleet stays up.
func TestClosedSessionTakesItsNodeOfflineAtOnce(t *testing.T) {
	t.Parallel()
	p := newPlane(t, slow)
	f := p.fleet(t, 50, "close", p.gw)
	gone := f.Nodes[7]
	start := time.Now()
	gone.Disconnect()
	computetest.Eventually(t, 10*time.Second, "the stopped node offline", func() bool { return p.status(t, gone.NodeID()) == api.NodeOffline })
	t.Logf("offline %v after the agent stopped", time.Since(start).Round(time.Millisecond))
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'node.offline' AND subject = $1`, gone.NodeID()); n != 1 {
		t.Fatalf("%d node.offline events, want 1", n)
	}
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.nodes WHERE status = 'online'`); n != 49 {
		t.Fatalf("%d nodes online, want the other 49", n)
	}
	gone.Resume()
	computetest.Eventually(t, 10*time.Second, "the node online again", func() bool { return p.status(t, gone.NodeID()) == api.NodeOnline })
}

// TestClosedSessionLosesToANewerOne: the end of a session taken over by one at another gateway
// does not take the node offline; the newer session's end does.
func TestClosedSessionLosesToANewerOne(t *testing.T) {
	t.Parallel()
	p := newPlane(t, slow)
	second := computetest.Attach(t, p.Env, computetest.Options{Configure: slow})
	gw2, _ := second.Gateway(t, "")
	id, tc := p.rawJoin(t, "moved")
	old := p.rawConnect(t, id, tc, p.gw)
	newer := p.rawConnect(t, id, tc, gw2)
	old.conn.Close()
	// The old session's end is recorded (for the next flush) as the first gateway lets it go; a
	// flush of that gateway after it has written it. A probe's session on that gateway makes
	// sure one comes, whether the old stream's end was recorded or taken for the takeover.
	computetest.Eventually(t, patience, "the first gateway holding no session", func() bool {
		return p.metric(t, "better_compute_gateway_sessions") == 0
	})
	flushes := p.metric(t, "better_compute_gateway_flush_nodes")
	p.rawSession(t, "probe")
	computetest.Eventually(t, patience, "a flush of the first gateway after the old session ended", func() bool {
		return p.metric(t, "better_compute_gateway_flush_nodes") > flushes
	})
	if got := p.status(t, id); got != api.NodeOnline {
		t.Fatalf("status %s after the old session ended, want online: the newer session holds the node", got)
	}
	newer.conn.Close()
	computetest.Eventually(t, 10*time.Second, "the node offline once its newest session ended", func() bool { return p.status(t, id) == api.NodeOffline })
}

// stat reads PostgreSQL's cumulative statistics after the backends have reported theirs.
func (p *plane) stat(t *testing.T, q string) int {
	t.Helper()
	// A backend reports its statistics when it goes idle, at most once a second: each idle
	// connection of the pool is told to report at once (pg_stat_force_next_flush applies to the
	// backend that runs it, as it goes idle after the statement). Connections in use meanwhile
	// are the background's, which the test measures and subtracts.
	conns := p.DB.Pool.AcquireAllIdle(p.ctx)
	for _, c := range conns {
		if _, err := c.Exec(p.ctx, `SELECT pg_catalog.pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	if _, err := p.DB.Pool.Exec(p.ctx, `SELECT pg_catalog.pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	return computetest.Count(t, p.DB.Pool, q)
}

// TestHeartbeatsCostStatementsPerFlushNotPerHeartbeat: 600 heartbeats carrying host pressure,
// whose health flips each time, cost a few transactions and row updates a flush, not one each;
// the last pressure still decides the node's health.
func TestHeartbeatsCostStatementsPerFlushNotPerHeartbeat(t *testing.T) {
	// Not parallel: it measures the background's rate of transactions, which tests beside it would disturb.
	p := newPlane(t, slow)
	n := p.rawSession(t, "beats")
	go func() { // the acknowledgements, read so the gateway is never held up sending them
		for {
			if _, err := n.st.Recv(); err != nil {
				return
			}
		}
	}()
	const xacts = `SELECT xact_commit FROM pg_catalog.pg_stat_database WHERE datname = current_database()`
	const updates = `SELECT sum(n_tup_upd)::int FROM pg_catalog.pg_stat_user_tables WHERE schemaname = 'compute' AND relname IN ('nodes', 'node_sessions')`
	// The background work (workers, River's queues, the webhook fan-out) commits transactions of
	// its own: measured idle for as long as the heartbeats take, and subtracted.
	idle := p.stat(t, xacts)
	start := time.Now()
	time.Sleep(3 * time.Second) // the window the background's rate is measured over, not a wait
	background := float64(p.stat(t, xacts)-idle) / time.Since(start).Seconds()
	x0, u0 := p.stat(t, xacts), computetest.Count(t, p.DB.Pool, updates)
	start = time.Now()
	const beats = 600
	for i := range beats {
		used := 0.5
		if i%2 == 1 || i == beats-1 {
			used = 0.95 // degraded
		}
		if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{
			Pressure: &agentv1.HostPressure{MemoryUsed: used}}}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // heartbeats spread over flushes, as a fleet's are: the behaviour measured
	}
	computetest.Eventually(t, 10*time.Second, "the node degraded by its last heartbeat's pressure", func() bool {
		node, err := p.Compute.API.Nodes.Get(p.ctx, p.RootKey, api.GetNode{Node: n.id})
		return err == nil && node.Health == api.HealthDegraded
	})
	x1, u1 := p.stat(t, xacts), computetest.Count(t, p.DB.Pool, updates)
	bg := int(background * time.Since(start).Seconds())
	t.Logf("%d heartbeats: %d transactions (%d of them the background's %.1f a second), %d row updates of nodes and sessions", beats, x1-x0, bg, background, u1-u0)
	x1 -= bg
	// Per flush (about one a second, a few seconds): a handful of each. The background's rate
	// (27 to 44 a second idle: the sequencer's ten, River's queues, the workers) varies between
	// the two windows, more on a loaded machine (226 once in a full run where 120 were
	// subtracted), hence the bound of half: one transaction a heartbeat would be 600 more.
	if x1-x0 > beats/2 || u1-u0 > beats/4 {
		t.Fatalf("%d heartbeats cost %d transactions and %d row updates: that grows per heartbeat, not per flush", beats, x1-x0, u1-u0)
	}
}

// TestPollDispatchesWhatWasNotAnnounced: a command and a desired state written without a
// notification reach their node by the poll, which reads only what changed.
func TestPollDispatchesWhatWasNotAnnounced(t *testing.T) {
	t.Parallel()
	p := newPlane(t, slow)
	f := p.fleet(t, 20, "quiet", p.gw)
	node := f.Nodes[3].NodeID()
	if _, err := p.DB.Pool.Exec(p.ctx, `INSERT INTO compute.commands (id, tenant_id, node_id, kind, deadline, created_by)
		SELECT gen_random_uuid(), tenant_id, id, 'health.check', now() + interval '1 minute', 'test' FROM compute.nodes WHERE id = $1`, node); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 20*time.Second, "the unannounced command done", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.commands WHERE node_id = $1 AND state = 'succeeded'`, node) == 1
	})
	gen := computetest.Count(t, p.DB.Pool, `UPDATE compute.node_desired SET generation = generation + 1, updated_at = now() WHERE node_id = $1 RETURNING generation`, node)
	computetest.Eventually(t, 20*time.Second, "the unannounced desired state applied", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT applied_generation FROM compute.node_desired WHERE node_id = $1`, node) == gen
	})
}

// TestStoppingGatewayLeavesNodesTheirGrace: a gateway that stops says goodbye; its nodes are not
// taken for gone but keep their grace to reconnect elsewhere.
func TestStoppingGatewayLeavesNodesTheirGrace(t *testing.T) {
	t.Parallel()
	p := newPlane(t, slow)
	p.fleet(t, 20, "stay", p.gw)
	// stop returns once the gateway has: its sessions closed by it (not taken for gone) and its
	// last flush written. Nothing of it is left to take a node offline.
	p.stop()
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.nodes WHERE status = 'online'`); n != 20 {
		t.Fatalf("%d of 20 nodes online after their gateway stopped, want all: they have their grace", n)
	}
}
