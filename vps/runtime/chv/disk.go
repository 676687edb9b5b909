package chv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/better-compute/compute/vps/runtime"
)

// An instance's disk is its own: Instance.Disk is an image the host's cache shares between
// instances and keeps by its checksum, so the VM boots from a qcow2 overlay on it in the VM's
// directory, made once and kept until Delete. qemu-img makes the overlay, and copies it into
// saved states and back.
//
// The overlay is the only disk with a backing file that a VM is given: cloud-hypervisor follows
// it when the disk says backing_files, and reads it in the format the overlay's header names
// (qemu-img create -F Instance.DiskFormat), without probing. The image under it is checked
// again before the overlay is made (runtime.CheckImage): a qcow2 image that names a backing
// file or a data file of its own would let the guest read that file on the host.

// savedDiskFile is the disk's copy in a saved state's directory.
const savedDiskFile = "disk.qcow2"

// diskOf is the VM's disk: its own overlay.
func diskOf(v vmFiles) diskConfig {
	return diskConfig{Path: v.disk, ImageType: "Qcow2", BackingFiles: true, ID: "disk0"}
}

// ensureDisk makes the instance's overlay on its image, when it has an image and no disk yet.
func (r *Runtime) ensureDisk(ctx context.Context, in runtime.Instance, v vmFiles) error {
	if in.Disk == "" {
		return nil
	}
	if _, err := os.Stat(v.disk); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("chv: instance %s's disk: %w", in.ID, err)
	}
	if _, err := runtime.CheckImage(ctx, r.opts.QemuImg, in.Disk, in.DiskFormat); err != nil {
		return fmt.Errorf("chv: instance %s: Disk: %w", in.ID, err)
	}
	tmp := v.disk + ".new"
	if err := r.qemuImg(ctx, "create", "-q", "-f", "qcow2", "-F", in.DiskFormat, "-b", in.Disk, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("chv: instance %s's disk: %w", in.ID, err)
	}
	if err := os.Rename(tmp, v.disk); err != nil {
		return fmt.Errorf("chv: instance %s's disk: %w", in.ID, err)
	}
	return nil
}

// copyDisk writes a standalone copy of the qcow2 disk from to to (through to.new and a
// rename). The source may be open in a paused VM: it is read without taking its lock.
func (r *Runtime) copyDisk(ctx context.Context, from, to string) error {
	tmp := to + ".new"
	if err := r.qemuImg(ctx, "convert", "-U", "-q", "-f", "qcow2", "-O", "qcow2", from, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, to); err != nil {
		return fmt.Errorf("chv: %w", err)
	}
	return nil
}

// qemuImg runs qemu-img.
func (r *Runtime) qemuImg(ctx context.Context, args ...string) error {
	bin, err := exec.LookPath(r.opts.QemuImg)
	if err != nil {
		return fmt.Errorf("chv: instances' disks need qemu-img (Debian: qemu-utils; Options.QemuImg): %w", err)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chv: qemu-img %s %s: %w: %s", args[0], filepath.Base(args[len(args)-1]), err, strings.TrimSpace(string(out)))
	}
	return nil
}
