package initramfs

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Where Build puts what /init reads.
const (
	// InitPath is bcd, which the kernel runs as PID 1.
	InitPath = "init"
	// ModuleListPath lists the modules /init loads, one absolute path a line, in order.
	ModuleListPath = "etc/bcd/modules"
)

// ModulesDirDefault is where a kernel's modules are: ModulesDirDefault/<version>.
const ModulesDirDefault = "/lib/modules"

// dirs are the directories /init mounts on or writes to: the mount points of /proc, /sys, /dev
// and /tmp, /etc for resolv.conf, /root as a home.
var dirs = []struct {
	name string
	perm uint32
}{{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777}, {"run", 0o755}, {"etc", 0o755}, {"root", 0o700}}

// Options are what Build puts in a ramdisk.
type Options struct {
	// Init is the path of the bcd binary to run as /init. It must be statically linked
	// (CGO_ENABLED=0 go build): the ramdisk has no C library or dynamic loader.
	Init string
	// KernelVersion is the kernel the ramdisk boots with ("6.1.0-57-amd64"): its modules come
	// from ModulesDir/KernelVersion. Required.
	KernelVersion string
	// ModulesDir holds the kernels' module directories: ModulesDirDefault.
	ModulesDir string
	// Modules are the names of the modules to carry, resolved with their dependencies from
	// modules.dep: nil is DefaultModules, an empty non-nil list is none.
	Modules []string
	// MTime is every entry's modification time (seconds since 1970): zero by default, so that
	// the same inputs give the same bytes.
	MTime uint32
}

// Manifest is what Build put in a ramdisk.
type Manifest struct {
	Entries []Entry   // the archive's entries, in order, with their contents
	Modules ModuleSet // the modules carried, in load order, and the names the kernel builds in
	Bytes   int64     // the size of the compressed archive
}

var kernelVersionRE = regexp.MustCompile(`^[A-Za-z0-9._+~-]+$`)

// Build writes the ramdisk of opts to w (a gzip-compressed newc cpio archive) and says what it
// holds: /init (opts.Init), /dev/console and /dev/null (for init's output before devtmpfs is
// mounted), the directories of dirs, the modules of opts.Modules and their dependencies
// under /lib/modules/<version>/, and ModuleListPath, the order to load them in.
func Build(w io.Writer, opts Options) (Manifest, error) {
	if opts.ModulesDir == "" {
		opts.ModulesDir = ModulesDirDefault
	}
	if opts.Modules == nil {
		opts.Modules = DefaultModules
	}
	switch {
	case opts.Init == "":
		return Manifest{}, errors.New("initramfs: Options.Init is required: the path of a static bcd binary")
	case opts.KernelVersion == "":
		return Manifest{}, errors.New("initramfs: Options.KernelVersion is required (6.1.0-57-amd64): the modules must be the booted kernel's")
	case !kernelVersionRE.MatchString(opts.KernelVersion):
		return Manifest{}, fmt.Errorf("initramfs: Options.KernelVersion %q is not a kernel version (6.1.0-57-amd64)", opts.KernelVersion)
	}
	initBin, err := os.ReadFile(opts.Init)
	if err != nil {
		return Manifest{}, fmt.Errorf("initramfs: Options.Init: %w", err)
	}
	if err := checkStatic(initBin); err != nil {
		return Manifest{}, fmt.Errorf("initramfs: Options.Init %s: %w", opts.Init, err)
	}
	kdir := filepath.Join(opts.ModulesDir, opts.KernelVersion)
	if st, err := os.Stat(kdir); err != nil || !st.IsDir() {
		return Manifest{}, fmt.Errorf("initramfs: %s is not a directory: is kernel %s's image installed (linux-image-%s), or is Options.KernelVersion wrong?", kdir, opts.KernelVersion, opts.KernelVersion)
	}
	set, err := Resolve(kdir, opts.Modules)
	if err != nil {
		return Manifest{}, err
	}

	a := &Archive{MTime: opts.MTime}
	for _, d := range dirs {
		if err := a.AddDir(d.name, d.perm); err != nil {
			return Manifest{}, err
		}
	}
	if err := a.AddFile(InitPath, 0o755, initBin); err != nil {
		return Manifest{}, err
	}
	if err := a.AddCharDev("dev/console", 0o600, 5, 1); err != nil {
		return Manifest{}, err
	}
	if err := a.AddCharDev("dev/null", 0o666, 1, 3); err != nil {
		return Manifest{}, err
	}
	var list bytes.Buffer
	list.WriteString("# The kernel modules bcd init loads, in this order (written by mkramdisk).\n")
	for _, m := range set.Load {
		b, err := os.ReadFile(filepath.Join(kdir, m.Path))
		if err != nil {
			return Manifest{}, fmt.Errorf("initramfs: module %s: %w", m.Name, err)
		}
		name := path.Join("lib/modules", opts.KernelVersion, filepath.ToSlash(m.Path))
		if err := a.AddFile(name, 0o644, b); err != nil {
			return Manifest{}, err
		}
		list.WriteString("/" + name + "\n")
	}
	if err := a.AddFile(ModuleListPath, 0o644, list.Bytes()); err != nil {
		return Manifest{}, err
	}
	n, err := a.WriteTo(w)
	if err != nil {
		return Manifest{}, err
	}
	return Manifest{Entries: a.Entries(), Modules: set, Bytes: n}, nil
}

// checkStatic refuses a binary the ramdisk could not run: not ELF, or dynamically linked (it
// names an interpreter, the dynamic loader, which the ramdisk does not have).
func checkStatic(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("is not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("is an ELF %s, not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("is dynamically linked (it names an ELF interpreter): build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// ParseModuleList reads a ModuleListPath file: absolute paths of .ko files, one a line, in
// the order to load them; blank lines and lines starting with # are skipped.
func ParseModuleList(b []byte) ([]string, error) {
	var paths []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "/") || path.Clean(line) != line || !strings.HasSuffix(line, ".ko") {
			return nil, fmt.Errorf("initramfs: module list line %d: %q is not the clean absolute path of a .ko file", i+1, line)
		}
		paths = append(paths, line)
	}
	return paths, nil
}
