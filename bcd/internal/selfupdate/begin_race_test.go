package selfupdate

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestATrialReadDuringBeginStays: Begin writes the trial, then switches current to its slot; a
// reader in between (the supervisor looks every 250 ms, the node's status every second) sees a
// trial of a slot that is not current yet. It must not take the trial away: the new binary would
// then run with no deadline, and the supervisor would run a binary that exits at once for ever.
func TestATrialReadDuringBeginStays(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := Slots{Dir: filepath.Join(dir, "slots")}
	self := filepath.Join(dir, "bcd")
	writeFile(t, self, "v1")
	if err := s.Seed(self); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = s.Trial()
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for i := range 50 {
		cur, _, err := s.Current()
		if err != nil {
			t.Fatal(err)
		}
		next := Other(cur)
		if err := s.Write(next, strings.NewReader("build")); err != nil {
			t.Fatal(err)
		}
		if err := s.Begin(Trial{Slot: next, Previous: cur, Version: "v2"}); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Commit(next); !ok || err != nil {
			t.Fatalf("update %d: its trial was gone once it began (commit = %v, %v)", i, ok, err)
		}
	}
}
