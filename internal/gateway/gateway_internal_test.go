package gateway

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
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

// TestAdmissionIsRateLimited: new sessions beyond the burst are refused as unavailable (which
// agents retry) until tokens come back.
func TestAdmissionIsRateLimited(t *testing.T) {
	g := New(nil, Config{AdmitRate: 20, AdmitBurst: 3})
	for i := range 3 {
		if err := g.admit(); err != nil {
			t.Fatalf("session %d of a burst of 3 refused: %v", i, err)
		}
	}
	err := g.admit()
	if connect.CodeOf(err) != connect.CodeUnavailable || !errors.Is(err, ErrBusy) {
		t.Fatalf("a 4th session at once: %v, want unavailable (busy)", err)
	}
	time.Sleep(60 * time.Millisecond) // a token every 50 ms
	if err := g.admit(); err != nil {
		t.Fatalf("a session after a token came back refused: %v", err)
	}
}
