package ramdisk

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// fakeMachine describes a machine's sysfs and procfs, which tree builds under a temporary
// directory as the Root of Inspect and of an Agent.
type fakeMachine struct {
	serial, uuid, vendor, model *string // nil: the file is absent
	cpuOnline, cpuinfo          string  // "": absent
	meminfo                     string
	disks                       []fakeDisk
	nics                        []fakeNIC
	pci                         []fakePCI
}

type fakeDisk struct {
	name      string
	sectors   int64
	removable bool
	virtual   bool // under /sys/devices/virtual, as dm-0 and md0 are
	dev       bool // a regular file of the disk's size at Root/dev/<name>
}

type fakeNIC struct {
	name, address string
	physical      bool // has a device link
}

type fakePCI struct{ addr, class, vendor, device string }

func str(s string) *string { return &s }

// server is a typical machine: a serial, two disks of which one removable, a physical NIC
// beside lo and a bridge, an NVIDIA GPU beside the BMC's VGA.
func server() fakeMachine {
	return fakeMachine{
		serial: str("SN-0042\n"), uuid: str("4c4c4544-0042-3510-8058-b4c04f4d3232"),
		vendor: str("Supermicro"), model: str("SYS-421GE-TNRT"),
		cpuOnline: "0-3,8-11\n",
		meminfo:   "MemTotal:       16330000 kB\nMemFree:         1000 kB\n",
		disks: []fakeDisk{
			{name: "vda", sectors: 4 << 20, dev: true},
			{name: "sdb", sectors: 31250000, removable: true},
		},
		nics: []fakeNIC{
			{name: "lo", address: "00:00:00:00:00:00"},
			{name: "eth0", address: "02:FC:00:00:00:01", physical: true},
			{name: "br0", address: "02:fc:00:00:00:99"},
		},
		pci: []fakePCI{
			{addr: "0000:17:00.0", class: "0x030200", vendor: "0x10de", device: "0x2330"},
			{addr: "0000:03:00.0", class: "0x030000", vendor: "0x1a03", device: "0x2000"},
			{addr: "0000:00:02.0", class: "0x030000", vendor: "0x1234", device: "0x1111"}, // QEMU's std-vga
			{addr: "0000:00:1f.0", class: "0x060100", vendor: "0x8086", device: "0x1bca"},
		},
	}
}

// tree builds m under a new temporary directory and returns it.
func tree(t *testing.T, m fakeMachine) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, rel string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	for name, v := range map[string]*string{"product_serial": m.serial, "product_uuid": m.uuid, "sys_vendor": m.vendor, "product_name": m.model} {
		if v != nil {
			write("sys/class/dmi/id/"+name, *v)
		}
	}
	if m.cpuOnline != "" {
		write("sys/devices/system/cpu/online", m.cpuOnline)
	}
	if m.cpuinfo != "" {
		write("proc/cpuinfo", m.cpuinfo)
	}
	write("proc/meminfo", m.meminfo)
	if err := os.MkdirAll(filepath.Join(root, "sys/block"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range m.disks {
		dir := "sys/devices/pci0000:00/0000:00:05.0/block/" + d.name
		if d.virtual {
			dir = "sys/devices/virtual/block/" + d.name
		}
		write(dir+"/size", strconv.FormatInt(d.sectors, 10)+"\n")
		write(dir+"/removable", map[bool]string{true: "1\n", false: "0\n"}[d.removable])
		link("../"+dir[len("sys/"):], "sys/block/"+d.name)
		if d.dev {
			write("dev/"+d.name, "")
			if err := os.Truncate(filepath.Join(root, "dev", d.name), d.sectors*512); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, n := range m.nics {
		dir := "sys/class/net/" + n.name
		write(dir+"/address", n.address+"\n")
		if n.physical {
			dev := "sys/devices/pci0000:00/0000:00:0" + strconv.Itoa(i) + ".1"
			write(dev+"/vendor", "0x1af4\n")
			link(filepath.Join(root, dev), dir+"/device")
		}
	}
	for _, p := range m.pci {
		dir := "sys/bus/pci/devices/" + p.addr
		write(dir+"/class", p.class+"\n")
		write(dir+"/vendor", p.vendor+"\n")
		write(dir+"/device", p.device+"\n")
	}
	return root
}
