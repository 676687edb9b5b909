package site

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pin/tftp/v3"
)

func tftpClient(t *testing.T, ts *testSite) *tftp.Client {
	t.Helper()
	c, err := tftp.NewClient(ts.Addrs().TFTP.String())
	must(t, err)
	c.SetTimeout(time.Second)
	c.SetRetries(2)
	return c
}

// TestTFTPServesIPXE: pin/tftp's client fetches each iPXE binary, with a leading slash too.
func TestTFTPServesIPXE(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	c := tftpClient(t, ts)
	for name, want := range map[string][]byte{BIOSBinary: biosBytes, "/" + BIOSBinary: biosBytes, EFIBinarySNP: efiBytes, EFIBinaryIPXE: ipxeEFI} {
		wt, err := c.Receive(name, "octet")
		if err != nil {
			t.Fatalf("RRQ %s: %v", name, err)
		}
		var got bytes.Buffer
		if _, err := wt.WriteTo(&got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%s: got %d bytes, want the file's %d", name, got.Len(), len(want))
		}
	}
}

// TestTFTPRefuses: nothing but the iPXE binaries is served (not a path out of IPXEDir, not
// another file in it), and writes are refused.
func TestTFTPRefuses(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	c := tftpClient(t, ts)
	for _, name := range []string{
		"../vmlinuz", "../../../../etc/passwd", "/etc/passwd", BIOSBinary + "/../../vmlinuz",
		"./" + BIOSBinary, "secret.txt", "", strings.ToUpper(BIOSBinary),
	} {
		wt, err := c.Receive(name, "octet")
		if err == nil {
			var got bytes.Buffer
			_, err = wt.WriteTo(&got)
		}
		if err == nil || !strings.Contains(err.Error(), "not an iPXE binary") {
			t.Errorf("RRQ %q: %v, want a refusal saying it is not an iPXE binary", name, err)
		}
	}
	rf, err := c.Send("upload.bin", "octet")
	if err == nil {
		_, err = rf.ReadFrom(strings.NewReader("data"))
	}
	if err == nil {
		t.Error("WRQ accepted")
	}
	if _, err := os.Stat(filepath.Join(ts.cfg.IPXEDir, "upload.bin")); !os.IsNotExist(err) {
		t.Errorf("a write left a file: %v", err)
	}
}

// TestTFTPBusybox: busybox's tftp, another real client, fetches the BIOS binary.
func TestTFTPBusybox(t *testing.T) {
	t.Parallel()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox is not installed (Debian package busybox): its tftp client is not tried")
	}
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	out := filepath.Join(t.TempDir(), "got")
	a := ts.Addrs().TFTP
	cmd := exec.Command(bb, "tftp", "-g", "-r", BIOSBinary, "-l", out, a.Addr().String(), strconv.Itoa(int(a.Port())))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox tftp: %v: %s", err, b)
	}
	got, err := os.ReadFile(out)
	must(t, err)
	if !bytes.Equal(got, biosBytes) {
		t.Errorf("busybox got %d bytes, want %d", len(got), len(biosBytes))
	}
	cmd = exec.Command(bb, "tftp", "-g", "-r", "../vmlinuz", "-l", out+"2", a.Addr().String(), strconv.Itoa(int(a.Port())))
	if b, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("busybox fetched ../vmlinuz: %s", b)
	}
}
