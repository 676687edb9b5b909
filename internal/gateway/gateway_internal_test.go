package gateway

import (
	"fmt"
	"testing"
	"time"
)

// TestSilentNodeOfflineWithin30s: whatever the fleet's size, a node that falls silent is past
// its grace, and taken offline by the worker's next tick (1 s), within 30 s.
func TestSilentNodeOfflineWithin30s(t *testing.T) {
	for _, n := range []int{1, 1_000, 10_000, 100_000} {
		g := New(nil, Config{})
		for i := range n {
			g.sessions[fmt.Sprint(i)] = &session{}
		}
		interval := g.HeartbeatInterval()
		if worst := g.grace(interval) + time.Second; worst > 30*time.Second {
			t.Errorf("%d sessions: interval %v, grace %v: a silent node is offline after up to %v, want ≤ 30s", n, interval, g.grace(interval), worst)
		}
	}
}
