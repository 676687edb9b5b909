package gateway_test

import (
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
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

// within polls cond until it holds or d passes.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not within %v", what, d)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestClosedSessionTakesItsNodeOfflineAtOnce: a node whose agent stops is offline in about a
// second, not after its grace period, with a node.offline event; the rest of the fleet stays up.
func TestClosedSessionTakesItsNodeOfflineAtOnce(t *testing.T) {
	p := newPlane(t, slow)
	f := p.fleet(t, 50, "close", p.gw)
	gone := f.Nodes[7]
	start := time.Now()
	gone.Disconnect()
	within(t, 2*time.Second, "the stopped node offline", func() bool { return p.status(t, gone.NodeID()) == api.NodeOffline })
	t.Logf("offline %v after the agent stopped", time.Since(start).Round(time.Millisecond))
	if n := p.count(t, `SELECT count(*) FROM compute.events WHERE type = 'node.offline' AND subject = $1`, gone.NodeID()); n != 1 {
		t.Fatalf("%d node.offline events, want 1", n)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.nodes WHERE status = 'online'`); n != 49 {
		t.Fatalf("%d nodes online, want the other 49", n)
	}
	gone.Resume()
	within(t, 10*time.Second, "the node online again", func() bool { return p.status(t, gone.NodeID()) == api.NodeOnline })
}

// TestClosedSessionLosesToANewerOne: the end of a session taken over by one at another gateway
// does not take the node offline; the newer session's end does.
func TestClosedSessionLosesToANewerOne(t *testing.T) {
	p := newPlane(t, slow)
	second := computetest.Attach(t, p.Env, computetest.Options{Configure: slow})
	gw2, _ := second.Gateway(t, "")
	id, tc := p.rawJoin(t, "moved")
	old := p.rawConnect(t, id, tc, p.gw)
	newer := p.rawConnect(t, id, tc, gw2)
	old.conn.Close()
	time.Sleep(1500 * time.Millisecond) // longer than a close takes (see above)
	if got := p.status(t, id); got != api.NodeOnline {
		t.Fatalf("status %s after the old session ended, want online: the newer session holds the node", got)
	}
	newer.conn.Close()
	within(t, 2*time.Second, "the node offline once its newest session ended", func() bool { return p.status(t, id) == api.NodeOffline })
}
