// Package storetest is the conformance suite every nodeagent.Store passes: the memory store of
// the simulator and bcd's bbolt journal behave the same.
package storetest

import (
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// Run runs the suite; open returns a fresh store, and reopen (if not nil) the same store as a
// restarted process would see it.
func Run(t *testing.T, open func(t *testing.T) nodeagent.Store, reopen func(t *testing.T, s nodeagent.Store) nodeagent.Store) {
	if reopen == nil {
		reopen = func(_ *testing.T, s nodeagent.Store) nodeagent.Store { return s }
	}
	t.Run("identity", func(t *testing.T) {
		s := open(t)
		if _, ok, err := s.Identity(); ok || err != nil {
			t.Fatalf("a new store has an identity: %v, %v", ok, err)
		}
		id := nodeagent.Identity{NodeID: "n1", NodeName: "gpu-1", KeyDER: []byte{1, 2}, CertDER: []byte{3}, CADER: [][]byte{{4}}, Gateways: []string{"g:443"}}
		if err := s.SetIdentity(id); err != nil {
			t.Fatal(err)
		}
		s = reopen(t, s)
		got, ok, err := s.Identity()
		if err != nil || !ok || got.NodeID != "n1" || string(got.KeyDER) != string(id.KeyDER) || got.Gateways[0] != "g:443" {
			t.Fatalf("identity after reopen = %+v, %v, %v", got, ok, err)
		}
	})
	t.Run("desired", func(t *testing.T) {
		s := open(t)
		ds := &agentv1.DesiredState{Generation: 7, Holds: []*agentv1.DeviceHold{{Holder: "r1", Cpuset: "0-3"}}}
		if err := s.SetDesired(ds, 7); err != nil {
			t.Fatal(err)
		}
		s = reopen(t, s)
		got, applied, err := s.Desired()
		if err != nil || applied != 7 || !proto.Equal(got, ds) {
			t.Fatalf("desired after reopen = %v, %d, %v", got, applied, err)
		}
	})
	t.Run("commands and results", func(t *testing.T) {
		s := open(t)
		if st, _ := s.CommandState("c1"); st != nodeagent.CommandUnseen {
			t.Fatalf("new command state %v", st)
		}
		if err := s.MarkStarted("c1"); err != nil {
			t.Fatal(err)
		}
		s = reopen(t, s)
		if st, _ := s.CommandState("c1"); st != nodeagent.CommandStarted {
			t.Fatalf("after a restart mid-command, state %v, want started", st)
		}
		if err := s.PutResult(&agentv1.CommandResult{CommandId: "c1", Ok: true}); err != nil {
			t.Fatal(err)
		}
		_ = s.MarkStarted("c1") // a repeat does not move a done command back
		s = reopen(t, s)
		rs, err := s.Results()
		if err != nil || len(rs) != 1 || rs[0].GetCommandId() != "c1" {
			t.Fatalf("results = %v, %v", rs, err)
		}
		if st, _ := s.CommandState("c1"); st != nodeagent.CommandDone {
			t.Fatalf("state after a result %v, want done", st)
		}
		if err := s.DeleteResult("c1"); err != nil {
			t.Fatal(err)
		}
		s = reopen(t, s)
		if rs, _ := s.Results(); len(rs) != 0 {
			t.Fatalf("an acknowledged result is still kept: %v", rs)
		}
		if st, _ := s.CommandState("c1"); st != nodeagent.CommandDone {
			t.Fatal("an acknowledged command is forgotten: a resend would run it again")
		}
	})
}
