package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// The formats an instance's disk image is booted as (Instance.DiskFormat). No other: QEMU
// reads a dozen formats, and some name other files (a vmdk's extents, a qcow2's backing file),
// so an image is read only as one of these two, said explicitly to every tool that opens it.
const (
	FormatRaw   = "raw"
	FormatQcow2 = "qcow2"
)

// ErrImageNamesAFile is an image refused because, read as its format, it names another file:
// a hypervisor would open that file on the host and give it to the guest.
var ErrImageNamesAFile = errors.New("the image names another file")

// qcow2Magic begins every qcow2 image.
var qcow2Magic = []byte("QFI\xfb")

// ImageFormat is the format the host boots an image as: qcow2 when the image begins with
// qcow2's magic, raw otherwise. The host decides it once, from the first bytes of a file whose
// content is fixed by its checksum, and passes it explicitly from then on. Probing by QEMU or
// libvirt would also recognise formats that name host files (a vmdk descriptor is text that
// names its extents): here such a file is raw bytes. A raw image that happens to begin like a
// qcow2 is read as a qcow2, and checked as one (CheckImage): the two readings never differ in
// what they let a guest reach.
func ImageFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, len(qcow2Magic))
	if _, err := io.ReadFull(f, head); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if bytes.Equal(head, qcow2Magic) {
		return FormatQcow2, nil
	}
	return FormatRaw, nil
}

// checkTimeout bounds qemu-img's reading of an image's header: a crafted header may ask for
// much work.
const checkTimeout = time.Minute

// CheckImage refuses an image that, read as format, would make a hypervisor open another file
// (ErrImageNamesAFile): a qcow2 with a backing file or an external data file. It returns the
// image's virtual size. A raw image names nothing; a qcow2 is read by `qemu-img info -f qcow2`
// (qemuImg, a path or a name on PATH), which opens neither its backing file nor its data file:
// QEMU's documented way to inspect an untrusted image (qemu-img(1), and the fix of
// CVE-2024-4467, which a host's qemu-img must have).
func CheckImage(ctx context.Context, qemuImg, path, format string) (int64, error) {
	if !filepath.IsAbs(path) { // nor a json: or protocol name for qemu-img to parse
		return 0, fmt.Errorf("image %q is not an absolute path", path)
	}
	switch format {
	case FormatRaw:
		fi, err := os.Stat(path)
		if err != nil {
			return 0, err
		}
		if !fi.Mode().IsRegular() {
			return 0, fmt.Errorf("image %s is not a regular file", path)
		}
		return fi.Size(), nil
	case FormatQcow2:
	default:
		return 0, fmt.Errorf("image format %q: want %q or %q", format, FormatRaw, FormatQcow2)
	}
	bin, err := exec.LookPath(qemuImg)
	if err != nil {
		return 0, fmt.Errorf("a qcow2 image is checked with qemu-img (Debian: qemu-utils): %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "info", "-U", "--output=json", "-f", FormatQcow2, path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("image %s is not a qcow2 qemu-img can read: %w: %s", path, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var info struct {
		Format          string `json:"format"`
		VirtualSize     int64  `json:"virtual-size"`
		BackingFilename string `json:"backing-filename"`
		FormatSpecific  struct {
			Data struct {
				DataFile string `json:"data-file"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return 0, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	switch {
	case info.Format != FormatQcow2:
		return 0, fmt.Errorf("qemu-img info %s: format %q, not qcow2", path, info.Format)
	case info.BackingFilename != "":
		return 0, fmt.Errorf("%w: a qcow2 whose backing file is %q; an image must stand alone (qemu-img convert -O qcow2 makes one that does)",
			ErrImageNamesAFile, info.BackingFilename)
	case info.FormatSpecific.Data.DataFile != "":
		return 0, fmt.Errorf("%w: a qcow2 whose data is in the file %q; an image must hold its own data (qemu-img convert -O qcow2 makes one that does)",
			ErrImageNamesAFile, info.FormatSpecific.Data.DataFile)
	}
	return info.VirtualSize, nil
}
