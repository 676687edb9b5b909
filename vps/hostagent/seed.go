package hostagent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/better-compute/compute/vps/hostapi"
)

// seedPath is where an instance's NoCloud seed is kept.
func (a *Agent) seedPath(id string) string { return filepath.Join(a.opts.Dir, "seeds", id+".iso") }

// writeSeed writes an instance's NoCloud seed, an ISO 9660 volume labelled cidata with
// meta-data, user-data and network-config, which cloud-init finds on any block device of the
// guest. An unchanged seed is not written again (its digest is kept beside it), so a running
// instance's disk is not replaced under it.
func (a *Agent) writeSeed(id string, ci *hostapi.CloudInit) (string, error) {
	sum := sha256.New()
	for _, f := range []string{ci.MetaData, ci.UserData, ci.NetworkConfig} {
		fmt.Fprintf(sum, "%d:%s", len(f), f)
	}
	digest := hex.EncodeToString(sum.Sum(nil))
	p := a.seedPath(id)
	if b, err := os.ReadFile(p + ".sha256"); err == nil && string(b) == digest {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	if err := buildSeed(p, ci); err != nil {
		return "", fmt.Errorf("the NoCloud seed: %w", err)
	}
	return p, os.WriteFile(p+".sha256", []byte(digest), 0o644)
}

// buildSeed makes the ISO at p, through a temporary file renamed into place.
func buildSeed(p string, ci *hostapi.CloudInit) error {
	tmp := p + ".tmp"
	_ = os.Remove(tmp)
	defer os.Remove(tmp)
	size := int64(len(ci.MetaData)+len(ci.UserData)+len(ci.NetworkConfig)) + 1<<20
	d, err := diskfs.Create(tmp, size, 2048) // ISO 9660 blocks
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(p), ".seed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 0, FSType: filesystem.TypeISO9660, VolumeLabel: "cidata", WorkDir: work})
	if err != nil {
		return err
	}
	for name, content := range map[string]string{"/meta-data": ci.MetaData, "/user-data": ci.UserData, "/network-config": ci.NetworkConfig} {
		f, err := fs.OpenFile(name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return err
		}
		if _, err := f.Write([]byte(content)); err != nil {
			return err
		}
	}
	iso, ok := fs.(*iso9660.FileSystem)
	if !ok {
		return fmt.Errorf("not an ISO 9660 filesystem")
	}
	// Rock Ridge keeps the names as cloud-init reads them (meta-data, not META_DAT).
	if err := iso.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: "cidata"}); err != nil {
		return err
	}
	if err := d.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil { // the hypervisor's user reads it
		return err
	}
	return os.Rename(tmp, p)
}
