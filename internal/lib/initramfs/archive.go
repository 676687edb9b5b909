// Package initramfs writes the ramdisk a machine PXE-boots with Debian's kernel: a
// gzip-compressed newc cpio archive (the format the kernel unpacks into its rootfs) holding bcd
// as /init, the directories init needs, and the kernel modules that reach the machine's disks
// and network with the order to load them in (Build). The archive's bytes depend only on what is
// put in it: entries are sorted, owned by root, with one fixed mtime and inode numbers given in
// order, so the same inputs give the same bytes.
package initramfs

import (
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// Kind is what an entry of an archive is.
type Kind int

// The kinds of entry an archive holds.
const (
	KindDir Kind = iota
	KindFile
	KindSymlink
	KindCharDev
)

// String names the kind: dir, file, symlink, chardev.
func (k Kind) String() string {
	switch k {
	case KindDir:
		return "dir"
	case KindFile:
		return "file"
	case KindSymlink:
		return "symlink"
	case KindCharDev:
		return "chardev"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Entry is one file of an archive, named by its path relative to the root ("init",
// "lib/modules/6.1.0-57-amd64/kernel/drivers/net/virtio_net.ko").
type Entry struct {
	Name string
	Kind Kind
	Perm uint32 // permission bits, 0o7777 at most
	Data []byte // a file's contents, a symlink's target
	// Major and Minor are a character device's numbers.
	Major, Minor uint32
}

// Archive is the set of entries of an initramfs, written sorted by name by WriteTo. Parent
// directories are added as an entry is. The zero value is empty and ready to use.
type Archive struct {
	// MTime is every entry's modification time, in seconds since 1970: zero unless the caller
	// wants another fixed time (SOURCE_DATE_EPOCH). It is never the build's time, so that the
	// same inputs give the same bytes.
	MTime   uint32
	entries map[string]Entry
}

// maxFileSize is the largest file newc's 32-bit size field can describe.
const maxFileSize = 1<<32 - 1

// Add adds e, and the directories above it (0755) that are not in the archive yet. It refuses
// a name that is not a clean relative path, a second entry of one name (unless both are the
// same directory), a file over 4 GiB (newc's limit) and permission bits beyond 0o7777.
func (a *Archive) Add(e Entry) error {
	if err := checkName(e.Name); err != nil {
		return err
	}
	if e.Perm&^0o7777 != 0 {
		return fmt.Errorf("initramfs: %s: permission %#o has bits beyond 0o7777", e.Name, e.Perm)
	}
	if len(e.Data) > maxFileSize {
		return fmt.Errorf("initramfs: %s: %d bytes is more than newc's 4 GiB limit", e.Name, len(e.Data))
	}
	if (e.Kind == KindDir || e.Kind == KindCharDev) && len(e.Data) > 0 {
		return fmt.Errorf("initramfs: %s: a %s has no contents", e.Name, e.Kind)
	}
	if e.Kind == KindSymlink && len(e.Data) == 0 {
		return fmt.Errorf("initramfs: %s: a symlink needs a target", e.Name)
	}
	if a.entries == nil {
		a.entries = map[string]Entry{}
	}
	if old, ok := a.entries[e.Name]; ok {
		if old.Kind == KindDir && e.Kind == KindDir && old.Perm == e.Perm {
			return nil
		}
		return fmt.Errorf("initramfs: %s is in the archive already (a %s)", e.Name, old.Kind)
	}
	for dir := path.Dir(e.Name); dir != "."; dir = path.Dir(dir) {
		if old, ok := a.entries[dir]; ok {
			if old.Kind != KindDir {
				return fmt.Errorf("initramfs: %s: %s is a %s, not a directory", e.Name, dir, old.Kind)
			}
			continue
		}
		a.entries[dir] = Entry{Name: dir, Kind: KindDir, Perm: 0o755}
	}
	e.Data = slices.Clone(e.Data)
	a.entries[e.Name] = e
	return nil
}

// AddDir adds a directory.
func (a *Archive) AddDir(name string, perm uint32) error {
	return a.Add(Entry{Name: name, Kind: KindDir, Perm: perm})
}

// AddFile adds a regular file with its contents.
func (a *Archive) AddFile(name string, perm uint32, data []byte) error {
	return a.Add(Entry{Name: name, Kind: KindFile, Perm: perm, Data: data})
}

// AddCharDev adds a character device node: the kernel makes it as it unpacks, which is how
// /dev/console exists before anything is mounted, for init's first output.
func (a *Archive) AddCharDev(name string, perm, major, minor uint32) error {
	return a.Add(Entry{Name: name, Kind: KindCharDev, Perm: perm, Major: major, Minor: minor})
}

// Entries are the archive's entries sorted by name, as WriteTo writes them: a directory comes
// before what is in it, since a name sorts before every name it prefixes.
func (a *Archive) Entries() []Entry {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]Entry, len(names))
	for i, n := range names {
		out[i] = a.entries[n]
	}
	return out
}

// WriteTo writes the archive to w as a gzip-compressed newc cpio archive, the format the
// kernel unpacks an initramfs from. Entries are in name order, owned by root, with MTime,
// and numbered from inode 1 in that order.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	// A zero gzip.Header has no name and no time: nothing of the build's moment or place.
	zw, err := gzip.NewWriterLevel(cw, gzip.BestCompression)
	if err != nil {
		return cw.n, err
	}
	rw := cpio.Newc.Writer(zw)
	for i, e := range a.Entries() {
		if err := rw.WriteRecord(record(e, uint64(i+1), a.MTime)); err != nil {
			return cw.n, fmt.Errorf("initramfs: writing %s: %w", e.Name, err)
		}
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return cw.n, fmt.Errorf("initramfs: writing the trailer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return cw.n, fmt.Errorf("initramfs: %w", err)
	}
	return cw.n, nil
}

// record is e as a cpio record: root's, one link, with the archive's mtime.
func record(e Entry, ino uint64, mtime uint32) cpio.Record {
	info := cpio.Info{Ino: ino, NLink: 1, MTime: uint64(mtime), Name: e.Name, Mode: uint64(e.Perm)}
	switch e.Kind {
	case KindDir:
		info.Mode |= cpio.S_IFDIR
		info.NLink = 2
	case KindFile:
		info.Mode |= cpio.S_IFREG
	case KindSymlink:
		info.Mode |= cpio.S_IFLNK
	case KindCharDev:
		info.Mode |= cpio.S_IFCHR
		info.Rmajor, info.Rminor = uint64(e.Major), uint64(e.Minor)
	}
	if e.Kind == KindFile || e.Kind == KindSymlink {
		return cpio.StaticRecord(e.Data, info)
	}
	return cpio.Record{Info: info}
}

// checkName accepts a clean path relative to the archive's root.
func checkName(name string) error {
	switch {
	case name == "" || name == ".":
		return fmt.Errorf("initramfs: an entry needs a name")
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("initramfs: %q: a name cannot hold a NUL byte", name)
	case strings.HasPrefix(name, "/"):
		return fmt.Errorf("initramfs: %q: names are relative to the archive's root (init, not /init)", name)
	case path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../"):
		return fmt.Errorf("initramfs: %q is not a clean path inside the archive", name)
	case name == cpio.Trailer:
		return fmt.Errorf("initramfs: %q is the name of the archive's end", name)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
