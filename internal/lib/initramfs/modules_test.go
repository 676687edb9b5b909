package initramfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeKernel writes a kernel module directory: modules.dep, modules.builtin, and each module's
// file holding its own name.
func fakeKernel(t *testing.T, dep, builtin string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	if builtin != "" {
		if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte(builtin), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range strings.Split(dep, "\n") {
		ko, _, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(ko, "#") {
			continue
		}
		p := filepath.Join(dir, ko)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("module "+ModuleName(ko)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A modules.dep as depmod writes it for Debian's 6.1 kernel (trimmed): each line lists all of
// a module's dependencies, the one to load first last.
const fakeDep = `kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/nvme/host/nvme-core.ko: kernel/lib/crc64.ko
kernel/drivers/nvme/host/nvme.ko: kernel/drivers/nvme/host/nvme-core.ko kernel/lib/crc64.ko
kernel/lib/crc64.ko:
kernel/drivers/net/ethernet/intel/e1000e/e1000e.ko:
kernel/drivers/scsi/zipped.ko.xz:
# a comment
`

func names(ms []Module) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// TestResolve resolves names against a fake modules.dep: dependencies before what needs them,
// each once, in modprobe's order, the names' order kept where it can be; built-in names set
// apart; "-" and "_" the same.
func TestResolve(t *testing.T) {
	t.Parallel()
	dir := fakeKernel(t, fakeDep, "kernel/drivers/ata/ahci.ko\nkernel/fs/ext4/ext4.ko\n")
	for _, tc := range []struct {
		name    string
		in      []string
		load    []string
		builtin []string
	}{
		{"virtio_net brings failover", []string{"virtio_net"},
			[]string{"virtio_ring", "virtio", "failover", "net_failover", "virtio_net"}, nil},
		{"shared dependencies once", []string{"virtio_pci", "virtio_net", "virtio_blk"},
			[]string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
				"failover", "net_failover", "virtio_net", "virtio_blk"}, nil},
		{"the names' order is kept", []string{"e1000e", "virtio_blk"},
			[]string{"e1000e", "virtio_ring", "virtio", "virtio_blk"}, nil},
		{"dash or underscore, path or .ko", []string{"nvme_core", "kernel/drivers/nvme/host/nvme.ko", "nvme-core"},
			[]string{"crc64", "nvme_core", "nvme"}, nil},
		{"a dependency asked for first", []string{"virtio", "virtio_blk"},
			[]string{"virtio_ring", "virtio", "virtio_blk"}, nil},
		{"built in", []string{"ahci", "virtio_blk", "ext4"},
			[]string{"virtio_ring", "virtio", "virtio_blk"}, []string{"ahci", "ext4"}},
		{"nothing", []string{}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Resolve(dir, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.load, names(set.Load)); d != "" {
				t.Errorf("load order (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.builtin, set.Builtin); d != "" {
				t.Errorf("built in (-want +got):\n%s", d)
			}
			// Whatever the case, every module comes after all it needs.
			placed := map[string]bool{}
			for _, m := range set.Load {
				for _, d := range m.Deps {
					if !placed[d] {
						t.Errorf("%s is loaded before %s, which it needs", m.Name, d)
					}
				}
				placed[m.Name] = true
			}
		})
	}
	set, err := Resolve(dir, []string{"net_failover"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Module{
		{Name: "failover", Path: "kernel/net/core/failover.ko"},
		{Name: "net_failover", Path: "kernel/drivers/net/net_failover.ko", Deps: []string{"failover"}},
	}
	if d := cmp.Diff(want, set.Load); d != "" {
		t.Errorf("modules (-want +got):\n%s", d)
	}
}

// TestResolveRefuses names the module or the line that is wrong.
func TestResolveRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dep string
		in        []string
		want      string
	}{
		{"unknown", fakeDep, []string{"virtio_net", "nosuch"}, "module nosuch is neither in"},
		{"not a name", fakeDep, []string{"a b"}, `"a b" is not a module name`},
		{"empty name", fakeDep, []string{""}, "is not a module name"},
		{"compressed", fakeDep, []string{"zipped"}, "module zipped is compressed (kernel/drivers/scsi/zipped.ko.xz)"},
		{"missing dependency", "kernel/a.ko: kernel/b.ko\n", []string{"a"}, "module b (needed by a) is not in modules.dep"},
		{"cycle", "kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/c.ko\nkernel/c.ko: kernel/a.ko\n", []string{"a"}, "cycle: a → b → c → a"},
		{"bad line", "kernel/a.ko kernel/b.ko\n", []string{"a"}, `modules.dep:1: "kernel/a.ko kernel/b.ko" is not`},
		{"escaping path", "../../a.ko:\n", []string{"a"}, "is not"},
		{"empty", "# nothing\n", []string{"a"}, "lists no modules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(tc.dep), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Resolve(dir, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Resolve = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	_, err := Resolve(t.TempDir(), []string{"virtio_net"})
	if err == nil || !strings.Contains(err.Error(), "run depmod") {
		t.Errorf("Resolve without modules.dep = %v, want an error saying to run depmod", err)
	}
}

// TestResolveDebianKernel resolves DefaultModules against the installed Debian kernel, where
// there is one (Debian package linux-image-amd64).
func TestResolveDebianKernel(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(ModulesDirDefault, testKernelVersion(t))
	set, err := Resolve(dir, DefaultModules)
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	for i, m := range set.Load {
		at[m.Name] = i
		if _, err := os.Stat(filepath.Join(dir, m.Path)); err != nil {
			t.Errorf("module %s: %v", m.Name, err)
		}
	}
	for _, before := range [][2]string{{"virtio_ring", "virtio"}, {"virtio", "virtio_net"}, {"failover", "net_failover"},
		{"net_failover", "virtio_net"}, {"nvme_core", "nvme"}, {"libahci", "ahci"}, {"scsi_mod", "sd_mod"}} {
		i, ok1 := at[before[0]]
		j, ok2 := at[before[1]]
		if !ok1 || !ok2 || i > j {
			t.Errorf("%s should be loaded before %s: positions %d (%v), %d (%v)", before[0], before[1], i, ok1, j, ok2)
		}
	}
	t.Logf("%d modules for %d names; built in: %v", len(set.Load), len(DefaultModules), set.Builtin)
}

// testKernelVersion is the Debian kernel the tests use: $BCD_TEST_KERNEL, or the only one
// under /lib/modules. The test is skipped without one.
func testKernelVersion(t *testing.T) string {
	t.Helper()
	if v := os.Getenv("BCD_TEST_KERNEL"); v != "" {
		return v
	}
	ents, err := os.ReadDir(ModulesDirDefault)
	var found []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(ModulesDirDefault, e.Name(), "modules.dep")); err == nil {
			found = append(found, e.Name())
		}
	}
	if err != nil || len(found) != 1 {
		t.Skipf("no single kernel under %s (found %v; set BCD_TEST_KERNEL, or install linux-image-amd64)", ModulesDirDefault, found)
	}
	return found[0]
}
