package initramfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// DefaultModules are the kernel modules a ramdisk carries unless told otherwise: what reaches
// the disks and the network of the machines a site is likely to have — virtual machines
// (virtio, and virtio_rng, which seeds the kernel's random number generator where the CPU
// has no RDRAND: DHCP waits for it), SATA (ahci), NVMe, the common SAS/RAID HBAs, and the
// common server NICs (Intel, Broadcom, Mellanox). A name the kernel builds in is fine: it
// needs no file.
var DefaultModules = []string{
	"virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "virtio_rng",
	"sd_mod", "ahci", "nvme", "megaraid_sas", "mpt3sas",
	"e1000", "e1000e", "igb", "ixgbe", "i40e", "ice", "bnxt_en", "tg3", "mlx5_core",
}

// Module is a kernel module to load, with the modules it needs (by name).
type Module struct {
	Name string   // virtio_net: the file's base name with "-" as "_", as the kernel names it
	Path string   // relative to the kernel's module directory: kernel/drivers/net/virtio_net.ko
	Deps []string // the names of the modules it needs, as modules.dep lists them
}

// ModuleSet is what Resolve found for a list of module names.
type ModuleSet struct {
	// Load are the modules to load, each after the modules it needs.
	Load []Module
	// Builtin are the names asked for that the kernel has built in (modules.builtin): nothing
	// to load.
	Builtin []string
}

// Resolve finds modules by name in dir, a kernel's module directory (/lib/modules/<version>),
// from its modules.dep and modules.builtin (written by depmod), and orders them so that each
// comes after what it needs: virtio_net brings net_failover and failover, and virtio and
// virtio_ring, before it. Names are taken as the kernel takes them ("nvme-core" is
// "nvme_core"); the order of names is kept where dependencies allow, so the same list gives
// the same order. A name the kernel neither has as a module nor builds in is an error, and so
// is a compressed module (.ko.xz, .ko.zst): /init loads modules with finit_module(2) as they
// are, and Debian's kernel ships them uncompressed.
func Resolve(dir string, names []string) (ModuleSet, error) {
	dep, err := readModulesDep(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return ModuleSet{}, err
	}
	builtin, err := readModulesBuiltin(filepath.Join(dir, "modules.builtin"))
	if err != nil {
		return ModuleSet{}, err
	}
	var set ModuleSet
	state := map[string]int{} // 1: being visited, 2: placed
	var visit func(name string, from []string) error
	visit = func(name string, from []string) error {
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("initramfs: modules.dep has a cycle: %s", strings.Join(append(from, name), " → "))
		}
		m, ok := dep[name]
		if !ok {
			return fmt.Errorf("initramfs: module %s (needed by %s) is not in modules.dep", name, from[len(from)-1])
		}
		state[name] = 1
		// modules.dep lists what a module needs so that the last is loaded first (modprobe
		// reads it backwards); visiting in that order keeps modprobe's order.
		for i := len(m.Deps) - 1; i >= 0; i-- {
			if err := visit(m.Deps[i], append(from, name)); err != nil {
				return err
			}
		}
		state[name] = 2
		set.Load = append(set.Load, m)
		return nil
	}
	seen := map[string]bool{}
	for _, raw := range names {
		name := ModuleName(raw)
		if raw == "" || name == "" || name == "." || strings.ContainsAny(name, "/ \t") {
			return ModuleSet{}, fmt.Errorf("initramfs: %q is not a module name (virtio_net, nvme)", raw)
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		if _, ok := dep[name]; !ok {
			if builtin[name] {
				set.Builtin = append(set.Builtin, name)
				continue
			}
			return ModuleSet{}, fmt.Errorf("initramfs: module %s is neither in %s/modules.dep nor built into the kernel (modules.builtin): is the name right, and is it this kernel's directory?", name, dir)
		}
		if err := visit(name, nil); err != nil {
			return ModuleSet{}, err
		}
	}
	for _, m := range set.Load {
		if !strings.HasSuffix(m.Path, ".ko") {
			return ModuleSet{}, fmt.Errorf("initramfs: module %s is compressed (%s): /init loads modules as they are, so use a kernel whose modules are plain .ko files", m.Name, m.Path)
		}
	}
	return set, nil
}

// ModuleName is the kernel's name for a module file or name: the base name without .ko (and
// any compression suffix), with "-" as "_".
func ModuleName(s string) string {
	s = path.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// readModulesDep reads modules.dep: "kernel/a/b.ko: kernel/c.ko kernel/d.ko" per line.
func readModulesDep(file string) (map[string]Module, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w (run depmod for the kernel, or give its module directory)", err)
	}
	mods := map[string]Module{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ko, deps, ok := strings.Cut(line, ":")
		if !ok || ko == "" || !filepath.IsLocal(ko) {
			return nil, fmt.Errorf("initramfs: %s:%d: %q is not \"kernel/…/module.ko: its dependencies\"", file, n, line)
		}
		m := Module{Name: ModuleName(ko), Path: ko}
		for _, d := range strings.Fields(deps) {
			if !filepath.IsLocal(d) {
				return nil, fmt.Errorf("initramfs: %s:%d: dependency %q is not a path inside the module directory", file, n, d)
			}
			m.Deps = append(m.Deps, ModuleName(d))
		}
		mods[m.Name] = m
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("initramfs: reading %s: %w", file, err)
	}
	if len(mods) == 0 {
		return nil, errors.New("initramfs: " + file + " lists no modules")
	}
	return mods, nil
}

// readModulesBuiltin reads modules.builtin (a path per line), absent on a kernel that builds
// nothing in.
func readModulesBuiltin(file string) (map[string]bool, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	builtin := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			builtin[ModuleName(line)] = true
		}
	}
	return builtin, nil
}
