package ramdisk

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/metal/siteapi"
	"github.com/google/go-cmp/cmp"
)

func TestInspectReadsEveryFact(t *testing.T) {
	t.Parallel()
	m := server()
	m.disks = append(m.disks,
		fakeDisk{name: "nvme0n1", sectors: 7500000000},
		fakeDisk{name: "loop0", sectors: 100}, fakeDisk{name: "ram0", sectors: 100},
		fakeDisk{name: "zram0", sectors: 100}, fakeDisk{name: "sr0", sectors: 100},
		fakeDisk{name: "dm-0", sectors: 100, virtual: true},
		fakeDisk{name: "mmcblk0", sectors: 0}, // a card reader without a card
	)
	m.nics = append(m.nics,
		fakeNIC{name: "eth1", address: "0C:42:A1:00:00:02", physical: true},
		fakeNIC{name: "ib0", address: "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:9b:00:10", physical: true},
		fakeNIC{name: "eth2", address: "02:fc:00:00:00:01", physical: true}, // a second port reporting the same MAC
	)
	in, err := Inspect(tree(t, m))
	if err != nil {
		t.Fatal(err)
	}
	want := siteapi.Facts{
		Serial: "SN-0042", Vendor: "Supermicro", Model: "SYS-421GE-TNRT",
		CPUs: 8, MemoryGiB: 16, // 16330000 kB is 15.57 GiB
		MACs:  []string{"02:fc:00:00:00:01", "0c:42:a1:00:00:02"},
		Disks: []string{"nvme0n1 3.5T", "sdb 14.9G removable", "vda 2.0G"},
		GPUs:  []string{"10de:2330 0000:17:00.0"},
	}
	if d := cmp.Diff(want, in.Facts); d != "" {
		t.Errorf("facts (-want +got):\n%s", d)
	}
	if in.SerialFrom != SerialFromProductSerial {
		t.Errorf("SerialFrom = %q, want %q", in.SerialFrom, SerialFromProductSerial)
	}
	for _, note := range []string{"BMC address not read", "mmcblk0 left out", "ib0 left out", "1a03:2000 at 0000:03:00.0 left out"} {
		if !slices.ContainsFunc(in.Notes, func(n string) bool { return strings.Contains(n, note) }) {
			t.Errorf("no note says %q; notes: %q", note, in.Notes)
		}
	}
	if err := in.Facts.Validate(); err != nil {
		t.Errorf("facts do not validate: %v", err)
	}
}

func TestInspectSerialFallsBack(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name         string
		serial, uuid *string
		want, from   string
	}{
		{"product serial", str("  ABC123  \n"), str("4C4C4544-0042"), "ABC123", SerialFromProductSerial},
		{"placeholder serial: the UUID", str("To Be Filled By O.E.M.\n"), str("4C4C4544-0042-3510-8058-B4C04F4D3232\n"), "4c4c4544-0042-3510-8058-b4c04f4d3232", SerialFromProductUUID},
		{"no serial: the UUID", nil, str("4c4c4544-0042"), "4c4c4544-0042", SerialFromProductUUID},
		{"placeholders both: the first MAC", str("Default string"), str("03000200-0400-0500-0006-000700080009"), "02:fc:00:00:00:01", SerialFromMAC},
		{"no DMI: the first MAC", nil, nil, "02:fc:00:00:00:01", SerialFromMAC},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := server()
			m.serial, m.uuid = c.serial, c.uuid
			m.nics = append(m.nics, fakeNIC{name: "eth1", address: "0c:42:a1:00:00:02", physical: true})
			in, err := Inspect(tree(t, m))
			if err != nil {
				t.Fatal(err)
			}
			if in.Facts.Serial != c.want || in.SerialFrom != c.from {
				t.Errorf("serial %q from %q, want %q from %q", in.Facts.Serial, in.SerialFrom, c.want, c.from)
			}
			if c.from != SerialFromProductSerial && !slices.ContainsFunc(in.Notes, func(n string) bool { return strings.HasPrefix(n, "serial is the") }) {
				t.Errorf("no note says where the serial came from: %q", in.Notes)
			}
		})
	}
}

func TestInspectRefusesAMachineWithoutIdentity(t *testing.T) {
	t.Parallel()
	m := server()
	m.serial, m.uuid = nil, nil
	m.nics = []fakeNIC{{name: "lo", address: "00:00:00:00:00:00"}}
	if _, err := Inspect(tree(t, m)); err == nil || !strings.Contains(err.Error(), "nothing identifies it") {
		t.Fatalf("err = %v, want one saying nothing identifies the machine", err)
	}
	m = server() // a serial, but no MAC: Facts.Validate refuses
	m.nics = nil
	if _, err := Inspect(tree(t, m)); err == nil || !strings.Contains(err.Error(), "facts.macs") {
		t.Fatalf("err = %v, want one naming facts.macs", err)
	}
}

func TestInspectCountsCPUsFromCpuinfo(t *testing.T) {
	t.Parallel()
	m := server()
	m.cpuOnline = ""
	m.cpuinfo = "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n\nprocessor\t: 2\n"
	in, err := Inspect(tree(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if in.Facts.CPUs != 3 {
		t.Errorf("CPUs = %d, want 3", in.Facts.CPUs)
	}
}

func TestInspectKeepsFirmwareTextPrintable(t *testing.T) {
	t.Parallel()
	m := server()
	m.vendor = str("Vendor\x01\x7f\xff Inc.")
	m.model = str(strings.Repeat("M", 300))
	in, err := Inspect(tree(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if in.Facts.Vendor != "Vendor Inc." || len(in.Facts.Model) != 128 {
		t.Errorf("vendor %q, model of %d bytes; want %q and 128", in.Facts.Vendor, len(in.Facts.Model), "Vendor Inc.")
	}
}

// TestInspectThisMachine reads the real machine the tests run on.
func TestInspectThisMachine(t *testing.T) {
	t.Parallel()
	nics, _ := filepath.Glob("/sys/class/net/*/device")
	if len(nics) == 0 {
		t.Skip("this machine has no physical NIC (a container's veth has no device link): Inspect would rightly refuse it")
	}
	in, err := Inspect("/")
	if err != nil {
		t.Fatal(err)
	}
	f := in.Facts
	t.Logf("facts: %+v (serial from %s)", f, in.SerialFrom)
	for _, n := range in.Notes {
		t.Logf("note: %s", n)
	}
	if err := f.Validate(); err != nil {
		t.Errorf("facts do not validate: %v", err)
	}
	if f.CPUs < 1 || f.MemoryGiB < 1 || len(f.MACs) < 1 || f.Serial == "" {
		t.Errorf("facts are not sane: %d CPUs, %d GiB, MACs %q, serial %q", f.CPUs, f.MemoryGiB, f.MACs, f.Serial)
	}
	if _, err := os.Stat("/sys/class/dmi/id/product_serial"); err != nil && in.SerialFrom == SerialFromProductSerial {
		t.Errorf("serial said to be from product_serial, which this machine does not have")
	}
}
