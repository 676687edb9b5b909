package cdi_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
)

// FuzzApplyWritesOnlyInItsDirectory: whatever the desired state says (holder names with
// slashes, dots, NULs; any index, UUID, profile), Apply writes nothing outside its directory,
// leaves no temporary file, and every spec it writes is for a holder that names a file there.
func FuzzApplyWritesOnlyInItsDirectory(f *testing.F) {
	f.Add("r1", int32(0), "GPU-a", "", int32(0), int32(-1), "0-3")
	f.Add("../../etc/passwd", int32(0), "GPU-a", "", int32(0), int32(-1), "")
	f.Add("a/../../b", int32(1), "all", "1g.10gb", int32(2), int32(-1), "")
	f.Add("..", int32(-1), "GPU-b", "", int32(0), int32(3), "")
	f.Add("x\x00y", int32(0), "GPU-a", "3g.40gb", int32(4), int32(-1), "0,2-4")
	f.Add(strings.Repeat("h", 300), int32(0), "GPU-a", "", int32(0), int32(-1), "")
	f.Add("ok.name:1", int32(1), "GPU-b", "", int32(0), int32(63), "")
	f.Fuzz(func(t *testing.T, holder string, index int32, uuid, mig string, migStart, share int32, cpuset string) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "cdi")
		c := &cdi.Converger{Dir: dir, Devices: gpus("GPU-a", "GPU-b")}
		ds := &agentv1.DesiredState{Holds: []*agentv1.DeviceHold{{Holder: holder, Cpuset: cpuset,
			Gpus: []*agentv1.HeldGPU{{Index: index, Uuid: uuid, MigProfile: mig, MigStart: migStart, Share: share}}}}}
		_ = c.Apply(context.Background(), ds)
		err := filepath.WalkDir(parent, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == parent || path == dir {
				return err
			}
			if filepath.Dir(path) != dir {
				t.Fatalf("holder %q: %s written outside %s", holder, path, dir)
			}
			name := d.Name()
			if d.IsDir() || strings.HasPrefix(name, ".") || name != "better-compute-"+holder+".json" {
				t.Fatalf("holder %q: unexpected %s in the spec directory", holder, name)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatal(err)
		}
	})
}
