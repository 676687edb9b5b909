package initramfs

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/u-root/u-root/pkg/cpio"
)

// readBack gunzips an archive and reads its records with u-root's newc reader (which stops at
// the trailer), contents included, and checks that the trailer ends the archive.
func readBack(t *testing.T, gz []byte) []cpio.Record {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("the archive is not gzip: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatalf("reading the cpio archive back: %v", err)
	}
	if end := bytes.TrimRight(raw, "\x00"); !bytes.HasSuffix(end, []byte(cpio.Trailer)) {
		t.Fatalf("the archive does not end with %s", cpio.Trailer)
	}
	return recs
}

func contents(t *testing.T, r cpio.Record) string {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func sample(t *testing.T) *Archive {
	t.Helper()
	a := &Archive{MTime: 1700000000}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.AddFile("init", 0o755, []byte("#!bcd")))
	must(a.AddCharDev("dev/console", 0o600, 5, 1))
	must(a.AddFile("lib/modules/6.1.0/kernel/a.ko", 0o644, []byte("module a")))
	must(a.AddDir("tmp", 0o1777))
	must(a.Add(Entry{Name: "bin/sh", Kind: KindSymlink, Perm: 0o777, Data: []byte("/init")}))
	must(a.AddFile("lib-x", 0o600, nil)) // sorts between lib and lib/…: '-' < '/'
	return a
}

// TestArchiveReadBack writes an archive and reads it back with a newc reader: every entry in
// name order after its parent directory, of its kind, mode, device numbers and contents, owned
// by root, with the fixed mtime and inodes numbered from 1.
func TestArchiveReadBack(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	n, err := sample(t).WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteTo says %d bytes, wrote %d", n, buf.Len())
	}
	type rec struct {
		Name         string
		Mode         uint64
		Rmajor       uint64
		Rminor       uint64
		Data         string
		Ino, NLink   uint64
		MTime        uint64
		UID, GID     uint64
		Major, Minor uint64
	}
	var got []rec
	for _, r := range readBack(t, buf.Bytes()) {
		got = append(got, rec{Name: r.Name, Mode: r.Mode, Rmajor: r.Rmajor, Rminor: r.Rminor, Data: contents(t, r),
			Ino: r.Ino, NLink: r.NLink, MTime: r.MTime, UID: r.UID, GID: r.GID, Major: r.Major, Minor: r.Minor})
	}
	const mt = 1700000000
	want := []rec{
		{Name: "bin", Mode: cpio.S_IFDIR | 0o755, Ino: 1, NLink: 2, MTime: mt},
		{Name: "bin/sh", Mode: cpio.S_IFLNK | 0o777, Data: "/init", Ino: 2, NLink: 1, MTime: mt},
		{Name: "dev", Mode: cpio.S_IFDIR | 0o755, Ino: 3, NLink: 2, MTime: mt},
		{Name: "dev/console", Mode: cpio.S_IFCHR | 0o600, Rmajor: 5, Rminor: 1, Ino: 4, NLink: 1, MTime: mt},
		{Name: "init", Mode: cpio.S_IFREG | 0o755, Data: "#!bcd", Ino: 5, NLink: 1, MTime: mt},
		{Name: "lib", Mode: cpio.S_IFDIR | 0o755, Ino: 6, NLink: 2, MTime: mt},
		{Name: "lib-x", Mode: cpio.S_IFREG | 0o600, Ino: 7, NLink: 1, MTime: mt},
		{Name: "lib/modules", Mode: cpio.S_IFDIR | 0o755, Ino: 8, NLink: 2, MTime: mt},
		{Name: "lib/modules/6.1.0", Mode: cpio.S_IFDIR | 0o755, Ino: 9, NLink: 2, MTime: mt},
		{Name: "lib/modules/6.1.0/kernel", Mode: cpio.S_IFDIR | 0o755, Ino: 10, NLink: 2, MTime: mt},
		{Name: "lib/modules/6.1.0/kernel/a.ko", Mode: cpio.S_IFREG | 0o644, Data: "module a", Ino: 11, NLink: 1, MTime: mt},
		{Name: "tmp", Mode: cpio.S_IFDIR | 0o1777, Ino: 12, NLink: 2, MTime: mt},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("read back (-want +got):\n%s", d)
	}
}

// TestArchiveGNUCpio lists the archive with GNU cpio, a reader that shares no code with the
// writer, where it is installed (Debian package cpio).
func TestArchiveGNUCpio(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio is not installed (Debian package cpio): the archive is not listed by GNU cpio")
	}
	var buf bytes.Buffer
	if _, err := sample(t).WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-it", "--quiet")
	cmd.Stdin = zr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("cpio -it: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var want []string
	for _, e := range sample(t).Entries() {
		want = append(want, e.Name)
	}
	if d := cmp.Diff(want, strings.Fields(string(out))); d != "" {
		t.Errorf("cpio -it (-want +got):\n%s", d)
	}
}

// TestArchiveDeterministic: the same entries, added in another order, give the same bytes.
func TestArchiveDeterministic(t *testing.T) {
	t.Parallel()
	var one, two bytes.Buffer
	if _, err := sample(t).WriteTo(&one); err != nil {
		t.Fatal(err)
	}
	b := &Archive{MTime: 1700000000}
	for _, e := range []Entry{
		{Name: "lib-x", Kind: KindFile, Perm: 0o600},
		{Name: "tmp", Kind: KindDir, Perm: 0o1777},
		{Name: "bin/sh", Kind: KindSymlink, Perm: 0o777, Data: []byte("/init")},
		{Name: "lib/modules/6.1.0/kernel/a.ko", Kind: KindFile, Perm: 0o644, Data: []byte("module a")},
		{Name: "dev/console", Kind: KindCharDev, Perm: 0o600, Major: 5, Minor: 1},
		{Name: "init", Kind: KindFile, Perm: 0o755, Data: []byte("#!bcd")},
	} {
		if err := b.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.WriteTo(&two); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one.Bytes(), two.Bytes()) {
		t.Error("the same entries added in another order gave other bytes")
	}
}

// TestArchiveRefuses names what is wrong with each entry it refuses, and keeps the archive as
// it was.
func TestArchiveRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		e    Entry
		want string
	}{
		{"absolute", Entry{Name: "/init", Kind: KindFile}, "relative to the archive's root"},
		{"dotdot", Entry{Name: "../etc/passwd", Kind: KindFile}, "not a clean path"},
		{"unclean", Entry{Name: "a//b", Kind: KindFile}, "not a clean path"},
		{"empty", Entry{Kind: KindFile}, "needs a name"},
		{"nul", Entry{Name: "a\x00b", Kind: KindFile}, "NUL"},
		{"trailer", Entry{Name: "TRAILER!!!", Kind: KindFile}, "archive's end"},
		{"perm", Entry{Name: "x", Kind: KindFile, Perm: 0o10000}, "beyond 0o7777"},
		{"dir with data", Entry{Name: "d", Kind: KindDir, Data: []byte("x")}, "has no contents"},
		{"symlink without target", Entry{Name: "l", Kind: KindSymlink}, "needs a target"},
		{"twice", Entry{Name: "init", Kind: KindFile}, "in the archive already"},
		{"dir over a file", Entry{Name: "init", Kind: KindDir, Perm: 0o755}, "in the archive already"},
		{"under a file", Entry{Name: "init/x", Kind: KindFile}, "init is a file, not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := sample(t)
			before := a.Entries()
			err := a.Add(tc.e)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Add(%+v) = %v, want an error containing %q", tc.e, err, tc.want)
			}
			if d := cmp.Diff(before, a.Entries()); d != "" {
				t.Errorf("a refused entry changed the archive:\n%s", d)
			}
		})
	}
	a := sample(t)
	if err := a.AddDir("tmp", 0o1777); err != nil {
		t.Errorf("adding the same directory again: %v", err)
	}
}
