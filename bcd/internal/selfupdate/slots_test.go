package selfupdate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestSlots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := Slots{Dir: filepath.Join(dir, "slots")}
	self := filepath.Join(dir, "bcd")
	writeFile(t, self, "v1")
	if _, ok, err := s.Current(); ok || err != nil {
		t.Fatalf("current before the seed: %v %v", ok, err)
	}
	if err := s.Seed(self); err != nil {
		t.Fatal(err)
	}
	if cur, ok, _ := s.Current(); !ok || cur != SlotA {
		t.Fatalf("current after the seed = %q", cur)
	}
	if b, _ := os.ReadFile(s.CurrentPath()); string(b) != "v1" || s.SlotOf(s.Path(SlotA)) != SlotA || s.SlotOf(self) != "" {
		t.Fatalf("slot a holds %q", b)
	}
	// A second seed changes nothing.
	writeFile(t, self, "other")
	if err := s.Seed(self); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(s.CurrentPath()); string(b) != "v1" {
		t.Fatalf("a second seed replaced slot a: %q", b)
	}

	// An update on trial: current moves; the trial counts the new binary's starts.
	if err := s.Write(SlotB, strings.NewReader("v2")); err != nil {
		t.Fatal(err)
	}
	tr := Trial{Slot: SlotB, Previous: SlotA, Version: "v2", PreviousVersion: "v1", Try: "v2/r#1", Started: time.Now(), Deadline: time.Now().Add(time.Minute)}
	if err := s.Begin(tr); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(s.CurrentPath()); string(b) != "v2" {
		t.Fatalf("current after Begin holds %q", b)
	}
	for i := 1; i <= MaxBoots; i++ {
		if rolled, err := s.Boot(SlotB, MaxBoots); rolled != nil || err != nil {
			t.Fatalf("start %d rolled back: %v %v", i, rolled, err)
		}
	}
	if got, _ := s.Trial(); got == nil || got.Boots != MaxBoots {
		t.Fatalf("the trial after %d starts: %+v", MaxBoots, got)
	}
	// The old binary starting does not count.
	if rolled, _ := s.Boot(SlotA, MaxBoots); rolled != nil {
		t.Fatal("the previous slot's start rolled back")
	}
	rolled, err := s.Boot(SlotB, MaxBoots)
	if err != nil || rolled == nil || rolled.Version != "v2" {
		t.Fatalf("start %d = %+v, %v; want a rollback", MaxBoots+1, rolled, err)
	}
	if cur, _, _ := s.Current(); cur != SlotA {
		t.Fatalf("current after the rollback = %s", cur)
	}
	rb, err := s.LastRollback()
	if err != nil || rb == nil || rb.Version != "v2" || rb.Try != "v2/r#1" || !strings.Contains(rb.Reason, "started 3 times") {
		t.Fatalf("the rollback record = %+v, %v", rb, err)
	}
	if got, _ := s.Trial(); got != nil {
		t.Fatalf("a trial after the rollback: %+v", got)
	}
	if again, _ := s.Rollback("twice"); again != nil {
		t.Fatal("a second rollback found a trial")
	}

	// A trial ended by its binary reaching the gateway stays.
	if err := s.Begin(tr); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Commit(SlotA); ok || err != nil {
		t.Fatalf("the other slot committed the trial: %v %v", ok, err)
	}
	if ok, err := s.Commit(SlotB); !ok || err != nil {
		t.Fatalf("commit = %v %v", ok, err)
	}
	if rolled, _ := s.Rollback("late"); rolled != nil {
		t.Fatal("a committed update was rolled back")
	}
	if cur, _, _ := s.Current(); cur != SlotB {
		t.Fatalf("current after the commit = %s", cur)
	}

	// A trial written but never switched to (a crash between the two) is no trial.
	if err := writeJSON(s.trialPath(), Trial{Slot: SlotA, Previous: SlotB, Version: "v3"}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Trial(); got != nil || err != nil {
		t.Fatalf("a trial of a slot that is not current = %+v, %v", got, err)
	}
	if rolled, _ := s.Rollback("stale"); rolled != nil {
		t.Fatal("a trial of a slot that is not current was rolled back")
	}
	if err := s.Begin(Trial{Slot: SlotB, Previous: SlotB}); err == nil {
		t.Fatal("a trial from a slot to itself was accepted")
	}
}
