package app

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/netpolicy"
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

// TestVMHostFetchesImagesUnderTheOutboundPolicy: the VM host fetches tenants' image URLs only
// from public addresses, as the control plane allows them, unless --vps-fetch-allow names a
// range (a local mirror): a URL at loopback is refused at the connection, whatever name led there.
func TestVMHostFetchesImagesUnderTheOutboundPolicy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("image")) }))
	defer srv.Close()
	get := func(allow ...string) error {
		f := &vmHostFlags{fetchAllow: allow}
		c, err := f.imageClient()
		if err != nil {
			return err
		}
		resp, err := c.Get(strings.Replace(srv.URL, "127.0.0.1", "localhost", 1))
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	var refused *netpolicy.RefusedError
	if err := get(); !errors.As(err, &refused) {
		t.Fatalf("an image at loopback with no range allowed: %v, want the outbound policy's refusal", err)
	}
	if err := get("127.0.0.0/8", "::1/128"); err != nil {
		t.Fatalf("an image at loopback with loopback allowed: %v", err)
	}
	if err := get("127.0.0.1"); err == nil || !strings.Contains(err.Error(), "--vps-fetch-allow") {
		t.Fatalf("a range that is not CIDR: %v, want an error naming the flag", err)
	}
}
