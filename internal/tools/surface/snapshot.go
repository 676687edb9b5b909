package surface

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Verdict is a snapshot judged against the code.
type Verdict struct {
	// What names the surface and its snapshot file.
	What string
	// Changes go from the snapshot to the code.
	Changes Changes
	// Snapshot is the version the snapshot was taken at, Version the code's.
	Snapshot, Version int
	// VersionName is where the code's version lives (api.Version).
	VersionName string
}

// Stale reports whether the snapshot must be written again: the surface or the version moved.
func (v Verdict) Stale() bool { return !v.Changes.None() || v.Snapshot != v.Version }

// Refused reports whether the snapshot may not be written: a breaking change without a new
// version, or a version that went back.
func (v Verdict) Refused() bool {
	return len(v.Changes.Breaking) > 0 && v.Version == v.Snapshot || v.Version < v.Snapshot
}

// Message says what changed and what to do.
func (v Verdict) Message() string {
	if !v.Stale() {
		return v.What + ": as recorded\n"
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s: the code differs from the snapshot (version %d; the code's is %d):\n%s", v.What, v.Snapshot, v.Version, v.Changes)
	switch {
	case v.Version < v.Snapshot:
		fmt.Fprintf(&b, "%s went back from %d to %d: a version only moves forward.\n", v.VersionName, v.Snapshot, v.Version)
	case v.Refused():
		fmt.Fprintf(&b, "These changes break clients or peers of version %d. Keep what they depend on (add beside it, deprecate, remove in a later version),\n"+
			"or make it a new version on purpose: set %s to %d and run go run ./internal/tools/cmd/surface (docs/compatibility.md).\n",
			v.Snapshot, v.VersionName, v.Snapshot+1)
	default:
		b.WriteString("Record them: go run ./internal/tools/cmd/surface\n")
	}
	return b.String()
}

// CheckAPI judges root's api/surface.json against the code, which it returns too.
func CheckAPI(root string) (Verdict, *API, error) {
	live, err := LiveAPI()
	if err != nil {
		return Verdict{}, nil, err
	}
	v := Verdict{What: "the API's surface (" + APIPath + ")", Version: live.Version, VersionName: "api.Version"}
	b, err := os.ReadFile(filepath.Join(root, APIPath))
	if errors.Is(err, os.ErrNotExist) {
		v.Changes = Diff(nil, FlattenAPI(live))
		v.Snapshot = live.Version
		return v, live, nil
	}
	if err != nil {
		return Verdict{}, nil, err
	}
	var snap API
	if err := json.Unmarshal(b, &snap); err != nil {
		return Verdict{}, nil, fmt.Errorf("surface: %s: %w", APIPath, err)
	}
	v.Snapshot, v.Changes = snap.Version, DiffAPI(&snap, live)
	return v, live, nil
}

// CheckProtocol judges root's agent/v1/surface.txt against the code, which it returns too.
func CheckProtocol(root string) (Verdict, string, error) {
	live := LiveProtocol()
	version, cur, err := ParseProtocol(live)
	if err != nil {
		return Verdict{}, "", fmt.Errorf("surface: the live protocol: %w", err)
	}
	v := Verdict{What: "the node protocol's surface (" + ProtocolPath + ")", Version: version, VersionName: "agentv1.ProtocolVersion"}
	b, err := os.ReadFile(filepath.Join(root, ProtocolPath))
	if errors.Is(err, os.ErrNotExist) {
		v.Changes, v.Snapshot = Diff(nil, cur), version
		return v, live, nil
	}
	if err != nil {
		return Verdict{}, "", err
	}
	snapVersion, old, err := ParseProtocol(string(b))
	if err != nil {
		return Verdict{}, "", fmt.Errorf("surface: %s: %w", ProtocolPath, err)
	}
	v.Snapshot, v.Changes = snapVersion, Diff(old, cur)
	return v, live, nil
}

// EncodeAPI is api/surface.json's content.
func EncodeAPI(s *API) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
