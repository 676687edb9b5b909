package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeWithTheCloudHypervisorRuntime: bcd node --vps-runtime chv makes the cloud-hypervisor
// runtime from --chv-binary: a missing binary fails at once, saying which flag and where to get
// it; an unknown runtime names the choices; with a binary there, the VM host starts without
// touching KVM (the node then stops for want of a join, nothing about the runtime).
func TestNodeWithTheCloudHypervisorRuntime(t *testing.T) {
	dir := t.TempDir()
	out, err := runBCD("", "node", "--state-dir", dir, "--vps-runtime", "chv", "--chv-binary", "/nonexistent")
	if err == nil || !strings.Contains(err.Error(), "--vps-runtime chv: chv: Options.Binary") ||
		!strings.Contains(err.Error(), "/nonexistent") || !strings.Contains(err.Error(), "cloud-hypervisor/releases") {
		t.Fatalf("bcd node --vps-runtime chv --chv-binary /nonexistent: %v\n%s", err, out)
	}
	if _, serr := os.Stat(filepath.Join(dir, "vps")); !os.IsNotExist(serr) {
		t.Fatalf("a runtime that failed made %s/vps: %v", dir, serr)
	}
	if _, err := runBCD("", "node", "--state-dir", dir, "--vps-runtime", "qemu"); err == nil ||
		!strings.Contains(err.Error(), `--vps-runtime "qemu": want libvirt (libvirt-kvm) or chv (cloud-hypervisor)`) {
		t.Fatalf("bcd node --vps-runtime qemu: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err = runBCD("", "node", "--state-dir", dir, "--vps-runtime", "chv", "--chv-binary", exe)
	if err == nil || strings.Contains(err.Error(), "chv") || strings.Contains(err.Error(), "vps") {
		t.Fatalf("bcd node with a chv binary there: %v\n%s; want it to fail for want of a join, not for the runtime", err, out)
	}
	if fi, serr := os.Stat(filepath.Join(dir, "vps", "consoles")); serr != nil || !fi.IsDir() {
		t.Fatalf("the VM host did not start: %v", serr)
	}
	t.Logf("without a join: %v", err)
}
