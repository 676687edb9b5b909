package chv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// record is what the runtime keeps of a VM besides the VMM itself: the instance it is, the
// configuration its VM was created with (to tell a change of shape) and the taps it uses (to
// remove them). It is written before the VM is created, so that a VM whose creation failed half
// way is still found, listed and deleted.
type record struct {
	ID     string   `json:"id"`
	Config vmConfig `json:"config"`
	Taps   []Tap    `json:"taps,omitempty"`
}

// savedRecordFile is the record's copy in a saved state's directory, beside cloud-hypervisor's
// own files (config.json, state.json, memory-ranges).
const savedRecordFile = "bc-record.json"

// readRecord reads a record; a missing file is os.ErrNotExist.
func readRecord(path string) (record, error) {
	var rec record
	data, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("chv: %s: %w", path, err)
	}
	if rec.ID == "" {
		return rec, fmt.Errorf("chv: %s: no instance id", path)
	}
	return rec, nil
}

// writeRecord writes a record through a temporary file and a rename.
func writeRecord(path string, rec record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("chv: encoding the record of %s: %w", rec.ID, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".record-*")
	if err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	_, err = tmp.Write(append(data, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("chv: writing %s: %w", path, err)
	}
	return nil
}

// sameConfig reports whether two configurations are the same VM shape.
func sameConfig(a, b vmConfig) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// removeSocket removes a Unix socket left at path by a VMM that is gone; anything else at path
// is left alone.
func removeSocket(path string) error {
	if path == "" {
		return nil
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("chv: %s exists and is not a socket: remove it or choose another path", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chv: removing the stale socket: %w", err)
	}
	return nil
}
