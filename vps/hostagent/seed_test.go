package hostagent

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/better-compute/compute/vps/hostapi"
)

// TestSeedIsANoCloudVolume: the seed is what cloud-init's NoCloud looks for (blkid, as
// cloud-init does, finds an iso9660 volume labelled cidata) with the three files by their full
// names; an unchanged seed is not written again, a changed one is.
func TestSeedIsANoCloudVolume(t *testing.T) {
	t.Parallel()
	a := &Agent{opts: Options{Dir: t.TempDir()}}
	ci := &hostapi.CloudInit{MetaData: "instance-id: i-1\nlocal-hostname: web\n", UserData: "#cloud-config\nruncmd: [true]\n",
		NetworkConfig: "version: 2\nethernets: {}\n"}
	p, err := a.writeSeed("i-1", ci)
	if err != nil {
		t.Fatal(err)
	}
	if blkid, err := exec.LookPath("blkid"); err == nil {
		for tag, want := range map[string]string{"LABEL": "cidata", "TYPE": "iso9660"} {
			out, err := exec.Command(blkid, "-p", "-o", "value", "-s", tag, p).Output()
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Fatalf("blkid %s of the seed = %q, %v; want %s", tag, out, err, want)
			}
		}
	} else {
		t.Log("blkid (util-linux) is not installed: the volume's label is read by go-diskfs only")
	}
	d, err := diskfs.Open(p, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(0)
	if err != nil {
		t.Fatal(err)
	}
	if l := fs.Label(); strings.TrimRight(l, "\x00 ") != "cidata" {
		t.Fatalf("the seed's label is %q", l)
	}
	for name, want := range map[string]string{"/meta-data": ci.MetaData, "/user-data": ci.UserData, "/network-config": ci.NetworkConfig} {
		f, err := fs.OpenFile(name, os.O_RDONLY)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := io.ReadAll(f)
		if err != nil || string(b) != want {
			t.Fatalf("%s = %q, %v; want %q", name, b, err, want)
		}
	}

	st, _ := os.Stat(p)
	if _, err := a.writeSeed("i-1", ci); err != nil {
		t.Fatal(err)
	}
	if st2, _ := os.Stat(p); !st2.ModTime().Equal(st.ModTime()) || !os.SameFile(st, st2) {
		t.Fatal("an unchanged seed was written again")
	}
	ci.UserData = "#cloud-config\nruncmd: [false]\n"
	if _, err := a.writeSeed("i-1", ci); err != nil {
		t.Fatal(err)
	}
	if st3, _ := os.Stat(p); os.SameFile(st, st3) {
		t.Fatal("a changed seed was not written again")
	}
}
