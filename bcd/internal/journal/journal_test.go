package journal_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/bcd/internal/journal"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/internal/node/nodeagent/storetest"
)

func TestConformance(t *testing.T) {
	open := func(t *testing.T) nodeagent.Store {
		j, err := journal.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j.Close() })
		return j
	}
	reopen := func(t *testing.T, s nodeagent.Store) nodeagent.Store {
		j := s.(*journal.Journal)
		dir := filepath.Dir(j.Path())
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		j2, err := journal.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { j2.Close() })
		return j2
	}
	storetest.Run(t, open, reopen)
}

func TestCorruptJournalIsReportedAndKept(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "journal.db")
	garbage := []byte(strings.Repeat("not a bbolt file ", 512))
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := journal.Open(dir)
	if err == nil || !strings.Contains(err.Error(), "move it aside") {
		t.Fatalf("Open of a corrupt journal = %v, want an error that says what to do", err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != string(garbage) {
		t.Fatal("the corrupt journal was changed")
	}
}

func TestOneProcessAtATime(t *testing.T) {
	dir := t.TempDir()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, err := journal.Open(dir); !errors.Is(err, journal.ErrLocked) {
		t.Fatalf("a second Open = %v, want ErrLocked", err)
	}
}
