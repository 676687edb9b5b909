// Command mkramdisk builds the ramdisk a machine PXE-boots with at a site: a gzip-compressed
// newc cpio archive holding bcd, built statically, as /init (bcd init, which runs bcd ramdisk),
// and the kernel modules that reach the machine's disks and network, taken with their
// dependencies from a Debian kernel's /lib/modules/<version>. It prints what it put in.
//
//	go run ./internal/tools/cmd/mkramdisk -o ramdisk.cpio.gz [-kernel-version 6.1.0-57-amd64] [-modules virtio_net,virtio_blk,…]
//
// Boot it with that kernel's vmlinuz and a command line naming the site (docs/ramdisk.md):
//
//	console=ttyS0 bcd.site=http://10.0.0.1:8067 panic=-1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/better-compute/compute/internal/lib/initramfs"
)

// bcdPackage is what mkramdisk builds as /init.
const bcdPackage = "github.com/better-compute/compute/bcd"

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "mkramdisk:", err)
		os.Exit(1)
	}
}

// run is mkramdisk with its arguments, printing what it built to stdout and the build's
// output to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("mkramdisk", flag.ContinueOnError)
	fl.SetOutput(stderr)
	out := fl.String("o", "", "where to write the ramdisk (required): ramdisk.cpio.gz")
	kernel := fl.String("kernel-version", "", "the kernel the ramdisk boots with, whose modules it carries (default: the running kernel's when its modules are installed, else the only kernel under -modules-dir)")
	modulesDir := fl.String("modules-dir", initramfs.ModulesDirDefault, "where the kernels' module directories are")
	modules := fl.String("modules", strings.Join(initramfs.DefaultModules, ","), "the kernel modules to carry, comma-separated, with their dependencies; empty for none")
	bcdBin := fl.String("bcd", "", "a statically linked bcd to use as /init instead of building one")
	goarch := fl.String("goarch", runtime.GOARCH, "the architecture to build bcd for: the kernel's")
	version := fl.String("bcd-version", "", "the version the built bcd reports (default: dev)")
	fl.Usage = func() {
		fmt.Fprintln(stderr, "usage: mkramdisk -o ramdisk.cpio.gz [-kernel-version 6.1.0-57-amd64] [-modules virtio_net,virtio_blk,…] [-bcd path]")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	switch {
	case *out == "":
		return errors.New("-o is required: where to write the ramdisk")
	case fl.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q: every input is a flag", fl.Args())
	case *bcdBin != "" && (*version != "" || *goarch != runtime.GOARCH):
		return errors.New("-bcd-version and -goarch are for building bcd; with -bcd it is built already")
	}
	if *kernel == "" {
		k, err := defaultKernel(*modulesDir)
		if err != nil {
			return err
		}
		*kernel = k
	}
	names := []string{}
	for _, m := range strings.Split(*modules, ",") {
		if m = strings.TrimSpace(m); m != "" {
			names = append(names, m)
		}
	}

	if *bcdBin == "" {
		dir, err := os.MkdirTemp("", "mkramdisk-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*bcdBin = filepath.Join(dir, "bcd")
		if err := buildBCD(ctx, *bcdBin, *goarch, *version, stderr); err != nil {
			return err
		}
	}

	// Written beside the output and renamed over it: a half-written ramdisk is never there.
	f, err := os.CreateTemp(filepath.Dir(*out), filepath.Base(*out)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	man, err := initramfs.Build(f, initramfs.Options{Init: *bcdBin, KernelVersion: *kernel, ModulesDir: *modulesDir, Modules: names})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), *out)
	}
	if err != nil {
		return err
	}
	return printManifest(stdout, *out, *kernel, man)
}

// buildBCD builds bcd as a static binary (CGO_ENABLED=0: the ramdisk has no C library), with
// paths trimmed so that the same source gives the same bytes.
func buildBCD(ctx context.Context, out, goarch, version string, stderr io.Writer) error {
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X " + bcdPackage + "/app.version=" + version
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, bcdPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building bcd (go build %s, CGO_ENABLED=0; run mkramdisk inside the repository, or give -bcd): %w", bcdPackage, err)
	}
	return nil
}

// defaultKernel is the running kernel, when its modules are under dir, else the only kernel
// there.
func defaultKernel(dir string) (string, error) {
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		running := strings.TrimSpace(string(b))
		if _, err := os.Stat(filepath.Join(dir, running, "modules.dep")); err == nil {
			return running, nil
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var found []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "modules.dep")); err == nil {
			found = append(found, e.Name())
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("give -kernel-version: the running kernel's modules are not under %s, and it holds %d kernels %v (Debian: apt-get install linux-image-amd64)", dir, len(found), found)
	}
	return found[0], nil
}

// printManifest says what the ramdisk holds: its size, the modules in load order, and every
// entry.
func printManifest(w io.Writer, out, kernel string, man initramfs.Manifest) error {
	var files, raw int64
	for _, e := range man.Entries {
		if e.Kind == initramfs.KindFile {
			files++
			raw += int64(len(e.Data))
		}
	}
	fmt.Fprintf(w, "%s: %s compressed (%s in %d files), for kernel %s\n", out, size(man.Bytes), size(raw), files, kernel)
	var load []string
	for _, m := range man.Modules.Load {
		load = append(load, m.Name)
	}
	fmt.Fprintf(w, "modules, in load order (%d): %s\n", len(load), strings.Join(load, " "))
	if len(man.Modules.Builtin) > 0 {
		fmt.Fprintf(w, "built into the kernel, not carried: %s\n", strings.Join(man.Modules.Builtin, " "))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, e := range man.Entries {
		detail := ""
		switch e.Kind {
		case initramfs.KindFile:
			detail = size(int64(len(e.Data)))
		case initramfs.KindCharDev:
			detail = fmt.Sprintf("%d:%d", e.Major, e.Minor)
		case initramfs.KindSymlink:
			detail = "→ " + string(e.Data)
		}
		fmt.Fprintf(tw, "%s\t%04o\t%s\t  /%s\n", e.Kind, e.Perm, detail, e.Name)
	}
	return tw.Flush()
}

func size(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
