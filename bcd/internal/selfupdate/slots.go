// Package selfupdate updates bcd in place: two binary slots under the state directory (A/B), a
// verified build installed into the inactive one, a switch and a re-exec, and a trial that the
// new binary ends by reaching its gateway, or that rolls back to the previous slot when it does
// not (it exits, hangs, or cannot connect) within a deadline. `bcd supervise` runs the current
// slot and enforces the trial from outside; the new binary enforces it from inside too
// (docs/releases.md).
package selfupdate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Slots are bcd's binary slots in Dir: a/bcd and b/bcd, the symlink current naming the slot to
// run (a unit runs Dir/current/bcd, or bcd supervise does), trial.json while a new binary has not
// proved itself, and rollback.json, the last update rolled back.
type Slots struct{ Dir string }

// The slots.
const (
	SlotA = "a"
	SlotB = "b"
)

// Binary is the name of the binary in a slot.
const Binary = "bcd"

// Path is the binary of slot.
func (s Slots) Path(slot string) string { return filepath.Join(s.Dir, slot, Binary) }

// CurrentPath is the binary the current symlink leads to: what a supervisor or a unit runs.
func (s Slots) CurrentPath() string { return filepath.Join(s.Dir, "current", Binary) }

// Current returns the slot the current symlink names; ok is false before the first.
func (s Slots) Current() (slot string, ok bool, err error) {
	t, err := os.Readlink(filepath.Join(s.Dir, "current"))
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("selfupdate: read the current slot: %w", err)
	}
	if t != SlotA && t != SlotB {
		return "", false, fmt.Errorf("selfupdate: %s/current leads to %q, not a slot", s.Dir, t)
	}
	return t, true, nil
}

// Other is the slot that is not slot.
func Other(slot string) string {
	if slot == SlotA {
		return SlotB
	}
	return SlotA
}

// SlotOf returns the slot whose binary is exe (links resolved), or "" when exe runs from
// neither.
func (s Slots) SlotOf(exe string) string {
	real, err := filepath.EvalSymlinks(exe)
	if err != nil {
		return ""
	}
	for _, slot := range []string{SlotA, SlotB} {
		if p, err := filepath.EvalSymlinks(s.Path(slot)); err == nil && p == real {
			return slot
		}
	}
	return ""
}

// Seed makes the slots on their first use: self (the binary running now) copied into slot a,
// and current leading to it. It does nothing once current exists.
func (s Slots) Seed(self string) error {
	if _, ok, err := s.Current(); err != nil || ok {
		return err
	}
	f, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("selfupdate: seed the slots: %w", err)
	}
	defer f.Close()
	if err := s.Write(SlotA, f); err != nil {
		return err
	}
	return s.setCurrent(SlotA)
}

func mkdirSlot(s Slots, slot string) error { return os.MkdirAll(filepath.Join(s.Dir, slot), 0o755) }

// Write replaces slot's binary with r's bytes (mode 0755), atomically.
func (s Slots) Write(slot string, r io.Reader) error {
	dir := filepath.Join(s.Dir, slot)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".bcd-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("selfupdate: write slot %s: %w", slot, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), s.Path(slot)); err != nil {
		return err
	}
	return syncDir(dir)
}

// setCurrent points current at slot, atomically (a new link renamed over the old).
func (s Slots) setCurrent(slot string) error {
	tmp := filepath.Join(s.Dir, ".current")
	_ = os.Remove(tmp)
	if err := os.Symlink(slot, tmp); err != nil {
		return fmt.Errorf("selfupdate: switch to slot %s: %w", slot, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, "current")); err != nil {
		return fmt.Errorf("selfupdate: switch to slot %s: %w", slot, err)
	}
	return syncDir(s.Dir)
}

// Trial is an update on trial: the slot switched to, the one it came from, and the deadline by
// which the new binary must have reached its gateway.
type Trial struct {
	Slot            string    `json:"slot"`
	Previous        string    `json:"previous"`
	Version         string    `json:"version"`
	PreviousVersion string    `json:"previousVersion"`
	Try             string    `json:"try"` // which try of the release (selfupdate.tryKey)
	Started         time.Time `json:"started"`
	Deadline        time.Time `json:"deadline"`
	// Boots counts the starts of the new binary during the trial.
	Boots int `json:"boots"`
}

// Rollback is an update that was rolled back, and why.
type Rollback struct {
	Version string    `json:"version"`
	Try     string    `json:"try"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

func (s Slots) trialPath() string    { return filepath.Join(s.Dir, "trial.json") }
func (s Slots) rollbackPath() string { return filepath.Join(s.Dir, "rollback.json") }

// Begin records t and switches current to its slot, in that order: a crash between the two
// leaves a trial for a slot that is not current, which Trial ignores.
func (s Slots) Begin(t Trial) error {
	if t.Slot == t.Previous || (t.Slot != SlotA && t.Slot != SlotB) {
		return fmt.Errorf("selfupdate: a trial of slot %q from slot %q", t.Slot, t.Previous)
	}
	if err := writeJSON(s.trialPath(), t); err != nil {
		return err
	}
	return s.setCurrent(t.Slot)
}

// Trial returns the update on trial, or nil: none, or one whose slot is not current (its switch
// never happened, or is about to: Begin writes the trial first). Such a trial is left alone, not
// removed: a reader during Begin would take the new trial away. It never becomes current
// without a Begin, which writes over it.
func (s Slots) Trial() (*Trial, error) {
	var t Trial
	if err := readJSON(s.trialPath(), &t); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	cur, ok, err := s.Current()
	if err != nil {
		return nil, err
	}
	if !ok || cur != t.Slot {
		return nil, nil
	}
	return &t, nil
}

// Boot is called when the binary of slot starts: during slot's trial it counts the start, and
// once the trial's binary has started more than maxBoots times without ending it, it rolls back
// (rolled is then the trial). The binary must then run the previous slot's.
func (s Slots) Boot(slot string, maxBoots int) (rolled *Trial, err error) {
	t, err := s.Trial()
	if err != nil || t == nil || t.Slot != slot {
		return nil, err
	}
	t.Boots++
	if t.Boots > maxBoots {
		return s.Rollback(fmt.Sprintf("it started %d times without reaching its gateway", t.Boots-1))
	}
	return nil, writeJSON(s.trialPath(), t)
}

// Commit ends slot's trial: the new binary reached its gateway. It reports whether there was a
// trial to end.
func (s Slots) Commit(slot string) (bool, error) {
	t, err := s.Trial()
	if err != nil || t == nil || t.Slot != slot {
		return false, err
	}
	return true, os.Remove(s.trialPath())
}

// Rollback ends the trial in failure: current goes back to the previous slot, and the update is
// recorded as rolled back for reason. It returns the trial, or nil when there was none (another
// process rolled it back first).
func (s Slots) Rollback(reason string) (*Trial, error) {
	t, err := s.Trial()
	if err != nil || t == nil {
		return nil, err
	}
	if err := writeJSON(s.rollbackPath(), Rollback{Version: t.Version, Try: t.Try, Reason: reason, At: time.Now().UTC()}); err != nil {
		return nil, err
	}
	if err := s.setCurrent(t.Previous); err != nil {
		return nil, err
	}
	return t, os.Remove(s.trialPath())
}

// LastRollback returns the last update rolled back, or nil.
func (s Slots) LastRollback() (*Rollback, error) {
	var r Rollback
	if err := readJSON(s.rollbackPath(), &r); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return &r, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("selfupdate: %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
