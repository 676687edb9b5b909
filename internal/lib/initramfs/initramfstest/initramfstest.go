// Package initramfstest prepares what VM-booting tests boot — Go programs built statically, and
// ramdisks made of them — once per content: each is kept in a cache directory shared by every
// test binary on the machine, named by a hash of its inputs (the Go toolchain, the flags, the
// source of every package it links; the init binary, the kernel and its modules' bytes). The
// first test to need one builds it; a test in the same binary, or in another package run at the
// same time or later, reuses it. A change to any input is a new name, so nothing stale is
// booted.
//
// Files are written beside their final name and renamed into place, so a reader never sees half
// of one; a lock file per name keeps two packages from building the same thing at once. When a
// new file is written, the older versions of it not used for an hour are removed (each change to
// bcd's source is a new 28 MB binary), and any file not used for a day.
package initramfstest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/internal/lib/initramfs"
)

// DirEnv names the cache directory instead of os.UserCacheDir()/better-compute-test.
const DirEnv = "BC_TEST_CACHE"

// How long a cached file may go unused before a new file's writer removes it: another version of
// the same file (a worktree at another commit may still use it), and any file.
const (
	supersededFor = time.Hour
	unusedFor     = 24 * time.Hour
)

// Dir is the cache directory, made if missing: $BC_TEST_CACHE, or better-compute-test under
// the user's cache directory (~/.cache), or under the temporary directory where there is none.
func Dir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(DirEnv)
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		dir = filepath.Join(base, "better-compute-test")
	}
	// 0755: a VM host's unprivileged daemon (vps's libvirtd) may read what is here.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("initramfstest: the cache directory: %v", err)
	}
	return dir
}

// Key is the hex SHA-256 of parts, each length-prefixed so that no two lists of parts collide.
func Key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// made remembers, per test binary, the files already found or made, so that tests of one
// binary that ask for the same file at once make it once.
var made struct {
	sync.Mutex
	files map[string]*madeFile
}

type madeFile struct {
	once sync.Once
	path string
	err  error
}

// File returns the path of the cached file name-key (key from Key, of everything the file is
// made from), calling make to write it at the path it is given when it is not there yet. make
// writes a temporary file that is renamed into place once it returns nil, and is called once
// per key on the machine at a time. A test must not change the file it is given.
func File(t testing.TB, name, key string, make func(path string) error) string {
	t.Helper()
	p, err := cached(Dir(t), name, key, make)
	if err != nil {
		t.Fatalf("initramfstest: %s: %v", name, err)
	}
	return p
}

// cached is File in dir.
func cached(dir, name, key string, make func(path string) error) (string, error) {
	final := filepath.Join(dir, name+"-"+key)
	made.Lock()
	if made.files == nil {
		made.files = map[string]*madeFile{}
	}
	f := made.files[final]
	if f == nil {
		f = &madeFile{path: final}
		made.files[final] = f
	}
	made.Unlock()
	f.once.Do(func() { f.err = makeFile(final, make) })
	return f.path, f.err
}

// makeFile makes final unless it is there, under a lock that other processes making it wait on.
func makeFile(final string, make func(string) error) error {
	unlock, err := lock(final + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(final); err == nil {
		now := time.Now()
		_ = os.Chtimes(final, now, now) // used: kept another day
		return nil
	}
	tmp := fmt.Sprintf("%s.%d.tmp", final, os.Getpid())
	defer os.Remove(tmp)
	if err := make(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // binaries run; everything is read by a VM host's daemon
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	prune(final)
	return nil
}

// prune removes, beside final (name-key), the versions of name unused for supersededFor, and
// every file unused for unusedFor, with their lock files.
func prune(final string) {
	dir, base := filepath.Split(final)
	name := nameOf(base)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || e.Name() == base || e.Name() == base+".lock" {
			continue
		}
		unused := time.Since(info.ModTime())
		if unused > unusedFor || unused > supersededFor && nameOf(e.Name()) == name {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// nameOf is the name of a cached file, its lock or its temporary file: what comes before the
// last "-", the key's.
func nameOf(file string) string {
	return file[:max(strings.LastIndex(file, "-"), 0)]
}

// Go is a Go program to build statically (CGO_ENABLED=0, -trimpath), for a ramdisk or a VM
// without a C library.
type Go struct {
	// Package is the import path of the main package, or of the package whose test binary to
	// build (Test).
	Package string
	// Test builds the package's test binary (go test -c) instead.
	Test bool
	// LDFlags are given to the linker (-ldflags), "-s -w" when empty.
	LDFlags string
	// Dir is where the go command runs, inside the module: the test's directory when empty.
	Dir string
}

// Build builds g, or finds it built from the same source, and returns the binary's path. The
// source is every file of every package it links that is not the standard library's (those of
// a module in the module cache by the module's version), with the Go version, GOOS, GOARCH and
// the flags. The go command runs in the test's directory, inside the module.
func Build(t testing.TB, g Go) string {
	t.Helper()
	key, err := g.cachedKey()
	if err != nil {
		t.Fatalf("initramfstest: %s: %v", g.Package, err)
	}
	name := filepath.Base(g.Package)
	if g.Test {
		name += ".test"
	}
	return File(t, name, key, func(out string) error {
		args := []string{"build"}
		if g.Test {
			args = []string{"test", "-c"}
		}
		args = append(args, "-trimpath", "-buildvcs=false", "-ldflags", g.ldflags(), "-o", out, g.Package)
		cmd := exec.Command("go", args...)
		cmd.Env, cmd.Dir = append(os.Environ(), "CGO_ENABLED=0"), g.Dir
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
		}
		return nil
	})
}

// keys are the keys found in this test binary: go list runs once per program.
var keys struct {
	sync.Mutex
	m map[Go]func() (string, error)
}

func (g Go) cachedKey() (string, error) {
	keys.Lock()
	if keys.m == nil {
		keys.m = map[Go]func() (string, error){}
	}
	k := keys.m[g]
	if k == nil {
		k = sync.OnceValues(g.key)
		keys.m[g] = k
	}
	keys.Unlock()
	return k()
}

func (g Go) ldflags() string {
	if g.LDFlags == "" {
		return "-s -w"
	}
	return g.LDFlags
}

// listed is what go list says of a package that the key needs.
type listed struct {
	ImportPath string
	Dir        string
	Standard   bool
	Module     *struct {
		Path, Version string
		Main          bool
		Replace       *struct{ Path, Version string }
	}
	GoFiles, SFiles, EmbedFiles, SysoFiles []string
	TestGoFiles, XTestGoFiles              []string
	TestEmbedFiles, XTestEmbedFiles        []string
}

// key hashes what the binary is built from.
func (g Go) key() (string, error) {
	args := []string{"list", "-deps", "-json=ImportPath,Dir,Standard,Module,GoFiles,SFiles,EmbedFiles,SysoFiles,TestGoFiles,XTestGoFiles,TestEmbedFiles,XTestEmbedFiles"}
	if g.Test {
		args = append(args, "-test")
	}
	args = append(args, g.Package)
	cmd := exec.Command("go", args...)
	cmd.Env, cmd.Dir = append(os.Environ(), "CGO_ENABLED=0"), g.Dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list: %w\n%s", err, stderr.Bytes())
	}
	goenv := exec.Command("go", "env", "GOVERSION", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "GOEXPERIMENT", "GOFLAGS")
	goenv.Dir = g.Dir
	env, err := goenv.Output()
	if err != nil {
		return "", fmt.Errorf("go env: %w", err)
	}
	parts := []string{"go", string(env), strconv.FormatBool(g.Test), g.ldflags()}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("go list: %w", err)
		}
		if p.Standard {
			continue // GOVERSION
		}
		parts = append(parts, "package", p.ImportPath)
		if m := p.Module; m != nil && !m.Main && m.Replace == nil && m.Version != "" {
			parts = append(parts, "module", m.Path+"@"+m.Version) // the module cache never changes a version
			continue
		}
		files := slices.Concat(p.GoFiles, p.SFiles, p.EmbedFiles, p.SysoFiles, p.TestGoFiles, p.XTestGoFiles, p.TestEmbedFiles, p.XTestEmbedFiles)
		slices.Sort(files)
		for _, f := range slices.Compact(files) {
			path := f
			if !filepath.IsAbs(f) { // a test binary's generated main is named by its path in the build cache
				path = filepath.Join(p.Dir, f)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return "", err
			}
			sum := sha256.Sum256(b)
			parts = append(parts, f, hex.EncodeToString(sum[:]))
		}
	}
	return Key(parts...), nil
}

// Ramdisk builds the ramdisk of opts (initramfs.Build), or finds it built from the same bytes,
// and returns its path: the key is the init binary's bytes, the kernel version, the mtime, and
// the path and bytes of every module it carries. It skips the test where the kernel's modules
// are not installed.
func Ramdisk(t testing.TB, opts initramfs.Options) string {
	t.Helper()
	if opts.ModulesDir == "" {
		opts.ModulesDir = initramfs.ModulesDirDefault
	}
	if opts.Modules == nil {
		opts.Modules = initramfs.DefaultModules
	}
	kdir := filepath.Join(opts.ModulesDir, opts.KernelVersion)
	if _, err := os.Stat(filepath.Join(kdir, "modules.dep")); errors.Is(err, fs.ErrNotExist) {
		t.Skipf("kernel %s's modules are not installed (Debian package linux-image-%s): %v", opts.KernelVersion, opts.KernelVersion, err)
	}
	set, err := initramfs.Resolve(kdir, opts.Modules)
	if err != nil {
		t.Fatalf("initramfstest: %v", err)
	}
	init, err := fileSum(opts.Init)
	if err != nil {
		t.Fatalf("initramfstest: the init binary: %v", err)
	}
	parts := []string{"ramdisk", init, opts.KernelVersion, strconv.FormatUint(uint64(opts.MTime), 10)}
	for _, m := range set.Load {
		sum, err := fileSum(filepath.Join(kdir, m.Path))
		if err != nil {
			t.Fatalf("initramfstest: module %s: %v", m.Name, err)
		}
		parts = append(parts, m.Path, sum)
	}
	parts = append(parts, "builtin")
	parts = append(parts, set.Builtin...)
	return File(t, "ramdisk-"+opts.KernelVersion, Key(parts...), func(out string) error {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		if _, err := initramfs.Build(f, opts); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
