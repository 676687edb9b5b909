package ramdisk

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/better-compute/compute/metal/siteapi"
)

// Where Inspection.Facts.Serial came from.
const (
	SerialFromProductSerial = "product_serial" // /sys/class/dmi/id/product_serial
	SerialFromProductUUID   = "product_uuid"   // /sys/class/dmi/id/product_uuid
	SerialFromMAC           = "mac"            // the first MAC of a physical NIC
)

// Inspection is what Inspect found of a machine: the facts its ramdisk reports, where the
// serial came from, and notes on what could not be read.
type Inspection struct {
	Facts siteapi.Facts
	// SerialFrom is where Facts.Serial came from: SerialFromProductSerial, SerialFromProductUUID
	// or SerialFromMAC.
	SerialFrom string
	// Notes say what was left out or could not be read, and why, one sentence each.
	Notes []string
	// disks are the disks found, with their sizes, for choosing where to write.
	disks []disk
}

// disk is a block device under /sys/block.
type disk struct {
	Name      string // "vda"
	Bytes     int64
	Removable bool
}

// placeholderSerials are what firmware writes in the DMI serial and UUID fields when the
// vendor left them blank: many machines share them, so they identify none.
var placeholderSerials = []string{
	"", "0", "none", "n/a", "na", "not specified", "not applicable", "default string",
	"to be filled by o.e.m.", "system serial number", "0123456789", "serial number",
	"chassis serial number", "not available", "unknown",
	"00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
	"03000200-0400-0500-0006-000700080009",
}

// bmcVGAVendors are PCI vendors whose display-class devices are a console's graphics, not GPUs:
// on servers the BMC's or the board's, ASPEED (1a03) and Matrox (102b, Dell's and HPE's
// iDRAC/iLO VGA); in a virtual machine, the emulated VGA (1234, Bochs/QEMU std-vga) and
// virtio-gpu (1af4, Red Hat's virtio).
var bmcVGAVendors = []string{"1a03", "102b", "1234", "1af4"}

// Inspect reads the machine's facts from the sysfs and procfs under root ("/" on the machine;
// a fake tree in tests): serial, vendor and model from DMI, CPUs, memory, disks, the MACs of
// its physical NICs and its GPUs. The BMC's address is left empty: it cannot be read without
// IPMI tools, which the ramdisk does not carry. The facts returned pass siteapi.Facts.Validate;
// a machine whose facts would not (no physical NIC, so no MAC) is an error.
func Inspect(root string) (Inspection, error) {
	if root == "" {
		root = "/"
	}
	var in Inspection
	f := &in.Facts
	dmi := func(name string) string { return readTrim(filepath.Join(root, "sys/class/dmi/id", name)) }
	f.Vendor, f.Model = printable(dmi("sys_vendor")), printable(dmi("product_name"))

	var err error
	if f.CPUs, err = cpus(root); err != nil {
		in.note("CPUs not counted: %v", err)
	}
	if f.MemoryGiB, err = memoryGiB(root); err != nil {
		in.note("memory not measured: %v", err)
	}
	if in.disks, err = disks(root, &in); err != nil {
		in.note("disks not listed: %v", err)
	}
	for _, d := range in.disks {
		f.Disks = append(f.Disks, d.String())
	}
	if f.MACs, err = macs(root, &in); err != nil {
		in.note("NICs not listed: %v", err)
	}
	if f.GPUs, err = gpus(root, &in); err != nil {
		in.note("GPUs not listed: %v", err)
	}
	in.note("BMC address not read: the ramdisk carries no IPMI tools")

	switch serial, uuid := dmi("product_serial"), dmi("product_uuid"); {
	case !placeholder(serial):
		f.Serial, in.SerialFrom = printable(serial), SerialFromProductSerial
	case !placeholder(uuid):
		f.Serial, in.SerialFrom = strings.ToLower(printable(uuid)), SerialFromProductUUID
		in.note("serial is the DMI product UUID: product_serial is %s", describeBlank(serial))
	case len(f.MACs) > 0:
		f.Serial, in.SerialFrom = f.MACs[0], SerialFromMAC
		in.note("serial is the first MAC: DMI has neither a product serial nor a product UUID")
	default:
		return in, errors.New("ramdisk: inspect: the machine has no DMI serial or UUID and no physical NIC: nothing identifies it")
	}
	if err := f.Validate(); err != nil {
		return in, fmt.Errorf("ramdisk: inspect: the facts found are not valid: %w", err)
	}
	return in, nil
}

func (in *Inspection) note(format string, args ...any) {
	in.Notes = append(in.Notes, fmt.Sprintf(format, args...))
}

// String is how a disk is written in the facts: "vda 2.0G", sizes in binary units as lsblk
// writes them, and "removable" after a removable disk.
func (d disk) String() string {
	s := d.Name + " " + humanBytes(d.Bytes)
	if d.Removable {
		s += " removable"
	}
	return s
}

func humanBytes(n int64) string {
	units := []string{"B", "K", "M", "G", "T", "P", "E"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(n, 10) + "B"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + units[i]
}

// cpus counts logical CPUs: the ranges of /sys/devices/system/cpu/online, else the processor
// lines of /proc/cpuinfo.
func cpus(root string) (int, error) {
	if s := readTrim(filepath.Join(root, "sys/devices/system/cpu/online")); s != "" {
		n, err := countRanges(s)
		if err == nil && n > 0 {
			return n, nil
		}
	}
	f, err := os.Open(filepath.Join(root, "proc/cpuinfo"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "processor" {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading cpuinfo: %w", err)
	}
	if n == 0 {
		return 0, errors.New("neither cpu/online nor cpuinfo names a CPU")
	}
	return n, nil
}

// countRanges counts the numbers of a kernel CPU list: "0-3,8,10-11" is 7.
func countRanges(s string) (int, error) {
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("CPU list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("CPU list %q: bad range %q", s, part)
			}
		}
		n += b - a + 1
	}
	return n, nil
}

// memoryGiB is MemTotal of /proc/meminfo in GiB, rounded to the nearest (MemTotal is a little
// less than what is installed: the kernel keeps some).
func memoryGiB(root string) (int, error) {
	f, err := os.Open(filepath.Join(root, "proc/meminfo"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kib, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || kib <= 0 || kib > 1<<40 {
				return 0, fmt.Errorf("meminfo MemTotal %q is not a size in kB", fields[1])
			}
			return int(math.Round(float64(kib) / (1 << 20))), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	return 0, errors.New("meminfo has no MemTotal")
}

// skippedDisks are block devices that are not disks to report or write: loop devices, RAM
// disks, compressed RAM, optical drives and floppies.
var skippedDisks = []string{"loop", "ram", "zram", "sr", "fd"}

// disks lists /sys/block: not the skipped kinds, not virtual devices (device-mapper, md, nbd),
// not empty ones (a card reader without a card), sorted by name.
func disks(root string, in *Inspection) ([]disk, error) {
	dir := filepath.Join(root, "sys/block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []disk
	for _, e := range entries {
		name := e.Name()
		if slices.ContainsFunc(skippedDisks, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err == nil && strings.Contains(target, "/devices/virtual/") {
			continue
		}
		sectors, err := strconv.ParseInt(readTrim(filepath.Join(dir, name, "size")), 10, 64)
		if err != nil || sectors < 0 {
			in.note("disk %s left out: its size is not readable", name)
			continue
		}
		if sectors == 0 {
			in.note("disk %s left out: it is empty (size 0)", name)
			continue
		}
		out = append(out, disk{
			Name:      name,
			Bytes:     sectors * 512,
			Removable: readTrim(filepath.Join(dir, name, "removable")) == "1",
		})
	}
	if len(out) > 64 {
		in.note("%d disks found; the first 64 are reported", len(out))
		out = out[:64]
	}
	return out, nil
}

// macs lists the MAC addresses of physical NICs, those of /sys/class/net with a device link,
// lowercase, in the order of their interface names, once each.
func macs(root string, in *Inspection) ([]string, error) {
	dir := filepath.Join(root, "sys/class/net")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if name == "lo" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name, "device")); err != nil {
			continue // virtual: a bridge, a bond, a tunnel
		}
		mac := strings.ToLower(readTrim(filepath.Join(dir, name, "address")))
		switch {
		case !siteapi.ValidMAC(mac):
			in.note("NIC %s left out: its address %q is not an Ethernet MAC", name, printable(mac))
		case mac == "00:00:00:00:00:00":
			in.note("NIC %s left out: its address is all zeros", name)
		case !slices.Contains(out, mac):
			out = append(out, mac)
		}
	}
	if len(out) > 64 {
		in.note("%d MACs found; the first 64 are reported", len(out))
		out = out[:64]
	}
	return out, nil
}

// gpus lists PCI devices of display class (0x03) as "vendor:device address", leaving out the
// BMC's VGA.
func gpus(root string, in *Inspection) ([]string, error) {
	dir := filepath.Join(root, "sys/bus/pci/devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		addr := e.Name()
		class := readTrim(filepath.Join(dir, addr, "class"))
		if !strings.HasPrefix(class, "0x03") {
			continue
		}
		vendor := strings.TrimPrefix(strings.ToLower(readTrim(filepath.Join(dir, addr, "vendor"))), "0x")
		device := strings.TrimPrefix(strings.ToLower(readTrim(filepath.Join(dir, addr, "device"))), "0x")
		if slices.Contains(bmcVGAVendors, vendor) {
			in.note("display device %s:%s at %s left out: it is a console's graphics (a BMC's, the board's, a virtual machine's)", vendor, device, addr)
			continue
		}
		out = append(out, printable(vendor+":"+device+" "+addr))
	}
	if len(out) > 64 {
		in.note("%d GPUs found; the first 64 are reported", len(out))
		out = out[:64]
	}
	return out, nil
}

// readTrim is a small sysfs file's text without surrounding space, or "" when it cannot be
// read.
func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// printable keeps what Facts.Validate accepts of firmware text: printable runes, at most 128
// bytes (DMI strings are shorter; a longer one is garbage).
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > 128 {
		s = strings.ToValidUTF8(s[:128], "")
	}
	return strings.TrimSpace(s)
}

func placeholder(s string) bool {
	return slices.Contains(placeholderSerials, strings.ToLower(printable(s)))
}

func describeBlank(s string) string {
	if s == "" {
		return "absent or empty"
	}
	return fmt.Sprintf("the placeholder %q", printable(s))
}
