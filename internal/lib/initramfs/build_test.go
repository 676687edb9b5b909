package initramfs

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/u-root/u-root/pkg/cpio"
)

// staticBinary builds a tiny Go program with CGO_ENABLED=0: a static executable like bcd's.
func staticBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestBuild builds a ramdisk from a fake kernel's modules and reads it back: /init is the
// binary, the directories and console are there, the modules asked for and their dependencies
// are under lib/modules/<version>/ as their files, and the module list names them in load
// order. The same inputs give the same bytes.
func TestBuild(t *testing.T) {
	t.Parallel()
	mods := t.TempDir()
	kdir := fakeKernel(t, fakeDep, "kernel/drivers/ata/ahci.ko\n")
	if err := os.Rename(kdir, filepath.Join(mods, "6.1.0-test")); err != nil {
		t.Fatal(err)
	}
	bin := staticBinary(t)
	opts := Options{Init: bin, KernelVersion: "6.1.0-test", ModulesDir: mods, Modules: []string{"virtio_net", "ahci", "virtio_blk"}}
	var one bytes.Buffer
	man, err := Build(&one, opts)
	if err != nil {
		t.Fatal(err)
	}
	if man.Bytes != int64(one.Len()) {
		t.Errorf("Manifest.Bytes = %d, wrote %d", man.Bytes, one.Len())
	}
	if d := cmp.Diff([]string{"ahci"}, man.Modules.Builtin); d != "" {
		t.Errorf("built in (-want +got):\n%s", d)
	}

	got := map[string]cpio.Record{}
	var order []string
	for _, r := range readBack(t, one.Bytes()) {
		got[r.Name] = r
		order = append(order, r.Name)
	}
	initBin, _ := os.ReadFile(bin)
	if r := got["init"]; r.Mode != cpio.S_IFREG|0o755 || contents(t, r) != string(initBin) {
		t.Errorf("init: mode %#o, %d bytes; want the binary, 0755", r.Mode, r.FileSize)
	}
	for name, mode := range map[string]uint64{"dev": cpio.S_IFDIR | 0o755, "proc": cpio.S_IFDIR | 0o555, "sys": cpio.S_IFDIR | 0o555,
		"tmp": cpio.S_IFDIR | 0o1777, "etc": cpio.S_IFDIR | 0o755, "dev/console": cpio.S_IFCHR | 0o600, "dev/null": cpio.S_IFCHR | 0o666} {
		if r, ok := got[name]; !ok || r.Mode != mode {
			t.Errorf("%s: mode %#o (present: %v), want %#o", name, r.Mode, ok, mode)
		}
	}
	if r := got["dev/console"]; r.Rmajor != 5 || r.Rminor != 1 {
		t.Errorf("dev/console is %d:%d, want 5:1", r.Rmajor, r.Rminor)
	}
	wantList := []string{
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_ring.ko",
		"/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio.ko",
		"/lib/modules/6.1.0-test/kernel/net/core/failover.ko",
		"/lib/modules/6.1.0-test/kernel/drivers/net/net_failover.ko",
		"/lib/modules/6.1.0-test/kernel/drivers/net/virtio_net.ko",
		"/lib/modules/6.1.0-test/kernel/drivers/block/virtio_blk.ko",
	}
	list, err := ParseModuleList([]byte(contents(t, got[ModuleListPath])))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantList, list); d != "" {
		t.Errorf("module list (-want +got):\n%s", d)
	}
	for _, p := range wantList {
		r, ok := got[strings.TrimPrefix(p, "/")]
		if !ok || contents(t, r) != "module "+ModuleName(p) || r.Mode != cpio.S_IFREG|0o644 {
			t.Errorf("%s: present %v, contents %q", p, ok, contents(t, r))
		}
	}
	for name := range got {
		if strings.HasSuffix(name, ".ko") && !strings.Contains(strings.Join(wantList, " "), "/"+name) {
			t.Errorf("%s is in the ramdisk but was not asked for", name)
		}
	}
	var entryNames []string
	for _, e := range man.Entries {
		entryNames = append(entryNames, e.Name)
	}
	if d := cmp.Diff(entryNames, order); d != "" {
		t.Errorf("Manifest.Entries differ from the archive (-manifest +archive):\n%s", d)
	}

	var two bytes.Buffer
	if _, err := Build(&two, opts); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one.Bytes(), two.Bytes()) {
		t.Error("building twice from the same inputs gave other bytes")
	}
}

// TestBuildRefuses names what is wrong with the options, before anything is written.
func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	mods := t.TempDir()
	kdir := fakeKernel(t, fakeDep, "")
	if err := os.Rename(kdir, filepath.Join(mods, "6.1.0-test")); err != nil {
		t.Fatal(err)
	}
	bin := staticBinary(t)
	text := filepath.Join(t.TempDir(), "init.sh")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ok := Options{Init: bin, KernelVersion: "6.1.0-test", ModulesDir: mods, Modules: []string{"virtio_net"}}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no init", func(o *Options) { o.Init = "" }, "Options.Init is required"},
		{"missing init", func(o *Options) { o.Init = "/nonexistent/bcd" }, "Options.Init: open /nonexistent/bcd"},
		{"script init", func(o *Options) { o.Init = text }, "is not an ELF executable"},
		{"no version", func(o *Options) { o.KernelVersion = "" }, "Options.KernelVersion is required"},
		{"bad version", func(o *Options) { o.KernelVersion = "../../etc" }, `"../../etc" is not a kernel version`},
		{"other version", func(o *Options) { o.KernelVersion = "5.10.0-1-amd64" }, "is kernel 5.10.0-1-amd64's image installed"},
		{"unknown module", func(o *Options) { o.Modules = []string{"nosuch"} }, "module nosuch is neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			var buf bytes.Buffer
			_, err := Build(&buf, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want an error containing %q", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Errorf("a refused build wrote %d bytes", buf.Len())
			}
		})
	}
	t.Run("dynamic init", func(t *testing.T) {
		dyn := "/bin/true"
		f, err := elf.Open(dyn)
		if err != nil {
			t.Skip(err)
		}
		interp := false
		for _, p := range f.Progs {
			interp = interp || p.Type == elf.PT_INTERP
		}
		f.Close()
		if !interp {
			t.Skip("/bin/true is static here")
		}
		o := ok
		o.Init = dyn
		_, err = Build(&bytes.Buffer{}, o)
		if err == nil || !strings.Contains(err.Error(), "is dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Fatalf("Build = %v, want an error saying it is dynamically linked", err)
		}
	})
}

// TestParseModuleList reads the list /init loads modules from, and refuses lines that are not
// absolute .ko paths.
func TestParseModuleList(t *testing.T) {
	t.Parallel()
	got, err := ParseModuleList([]byte("# comment\n\n/lib/modules/v/a.ko\n  /lib/modules/v/b.ko  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"/lib/modules/v/a.ko", "/lib/modules/v/b.ko"}, got); d != "" {
		t.Error(d)
	}
	for _, bad := range []string{"lib/a.ko", "/lib/../a.ko", "/lib/a.txt"} {
		if _, err := ParseModuleList([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("ParseModuleList(%q) = %v, want an error naming line 1", bad, err)
		}
	}
}
