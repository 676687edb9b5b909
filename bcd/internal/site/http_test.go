package site

import (
	"bytes"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// TestIPXEScripts fetches each kind of script over HTTP: before any plan, a machine that boots
// the ramdisk, an unknown machine under inspect and under ignore, a machine that boots its disk.
// A script that boots the ramdisk gives it a new boot's token (TOKEN below).
func TestIPXEScripts(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	b := ts.base
	seen := map[string]bool{}

	script := func(mac string) string {
		t.Helper()
		status, body, h := ts.do(t, "GET", "/boot/ipxe?mac="+mac, "", "")
		if status != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
			t.Fatalf("GET /boot/ipxe?mac=%s: %d %q", mac, status, h.Get("Content-Type"))
		}
		if !strings.HasPrefix(body, "#!ipxe\n") {
			t.Fatalf("not an iPXE script: %q", body)
		}
		if m := tokenRE.FindStringSubmatch(body); m != nil {
			if len(m[1]) != 43 || seen[m[1]] {
				t.Errorf("the boot token %q is not 32 random bytes, or not new", m[1])
			}
			seen[m[1]] = true
			body = strings.ReplaceAll(body, m[1], "TOKEN")
		}
		return body
	}

	// No plan yet: the machine waits and asks again, rather than boot its disk by mistake.
	if got, want := script(macRamdisk), "sleep 10\nchain --replace --autofree "+b+"/boot/ipxe?mac="+macRamdisk+"\n"; !strings.HasSuffix(got, want) {
		t.Errorf("before any plan:\n%s\nwant it to end with\n%s", got, want)
	}

	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	cases := []struct {
		name, mac, unknown string
		want               []string // lines the script has, in order
		not                []string // what it must not hold
	}{
		{name: "ramdisk", mac: macRamdisk, unknown: siteapi.UnknownInspect, want: []string{
			"kernel " + b + "/boot/vmlinuz initrd=initrd bcd.site=" + b + " bcd.machine=m-ramdisk bcd.token=TOKEN BOOTIF=01-52-54-00-00-00-01 console=ttyS0,115200 || goto failed",
			"initrd --name initrd " + b + "/boot/initrd || goto failed",
			"boot || goto failed",
		}},
		{name: "second NIC, upper case", mac: strings.ToUpper(macSecond), unknown: siteapi.UnknownInspect, want: []string{
			"kernel " + b + "/boot/vmlinuz initrd=initrd bcd.site=" + b + " bcd.machine=m-ramdisk bcd.token=TOKEN BOOTIF=01-52-54-00-00-00-03 console=ttyS0,115200 || goto failed",
		}},
		{name: "unknown, inspect", mac: macUnknown, unknown: siteapi.UnknownInspect, want: []string{
			"kernel " + b + "/boot/vmlinuz initrd=initrd bcd.site=" + b + " bcd.token=TOKEN BOOTIF=01-52-54-00-00-00-99 console=ttyS0,115200 || goto failed",
			"initrd --name initrd " + b + "/boot/initrd || goto failed",
			"boot || goto failed",
		}, not: []string{"bcd.machine"}},
		{name: "disk", mac: macDisk, unknown: siteapi.UnknownInspect, want: []string{"exit"}, not: []string{"kernel", "bcd.token"}},
		{name: "unknown, ignore", mac: macUnknown, unknown: siteapi.UnknownIgnore, want: []string{"exit"}, not: []string{"kernel"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			must(t, ts.SetPlan(testPlan(c.unknown)))
			got := script(c.mac)
			lines := strings.Split(got, "\n")
			i := 0
			for _, l := range lines {
				if i < len(c.want) && l == c.want[i] {
					i++
				}
			}
			if i < len(c.want) {
				t.Errorf("script:\n%s\nlacks the line (in order)\n%s", got, c.want[i])
			}
			for _, n := range c.not {
				if strings.Contains(got, n) {
					t.Errorf("script:\n%s\nholds %q", got, n)
				}
			}
		})
	}

	for _, bad := range []string{"", "52:54:00:00:00", "zz:54:00:00:00:01", "52-54-00-00-00-01"} {
		if status, body, _ := ts.do(t, "GET", "/boot/ipxe?mac="+bad, "", ""); status != http.StatusBadRequest || !strings.Contains(body, "mac:") {
			t.Errorf("mac=%q: %d %s, want 400 naming mac", bad, status, body)
		}
	}
}

// TestRamdiskFiles serves the kernel and initramfs whole and by range.
func TestRamdiskFiles(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	for path, want := range map[string][]byte{"/boot/vmlinuz": kernelBytes, "/boot/initrd": initrdBytes} {
		status, body, _ := ts.do(t, "GET", path, "", "")
		if status != http.StatusOK || body != string(want) {
			t.Errorf("GET %s: %d, %d bytes; want 200 and the file's %d", path, status, len(body), len(want))
		}
		req, _ := http.NewRequest("GET", ts.base+path, nil)
		req.Header.Set("Range", "bytes=8-15")
		c := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		resp, err := c.Do(req)
		must(t, err)
		part, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.CloseIdleConnections()
		if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(part, want[8:16]) {
			t.Errorf("GET %s bytes=8-15: %d %q, want 206 %q", path, resp.StatusCode, part, want[8:16])
		}
	}
	if status, _, _ := ts.do(t, "POST", "/boot/vmlinuz", "", "x"); status != http.StatusMethodNotAllowed {
		t.Errorf("POST /boot/vmlinuz: %d, want 405", status)
	}
}

// TestARefusedScriptNamesNoLease: a ramdisk script asked for from another address than the
// MAC's lease says to ask again, and does not say what the lease is: whoever knows a MAC must
// not learn the address its machine has (the address to spoof next). The site's log keeps it.
func TestARefusedScriptNamesNoLease(t *testing.T) {
	t.Parallel()
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.Logger = testLogger(t)
	s, err := New(cfg)
	must(t, err)
	s.cfg.DHCP.Mode, s.heard = DHCPProxy, newHeardTable() // proxy DHCP, without its listener
	must(t, s.SetPlan(testPlan(siteapi.UnknownInspect)))
	now := time.Now()
	lease := netip.MustParseAddr("10.9.8.7")
	s.hear(macRamdisk, lease, now)
	got := s.script(macRamdisk, netip.MustParseAddr("10.9.8.99"), now)
	if strings.Contains(got, "bcd.token") || !strings.Contains(got, "chain") || strings.Contains(got, lease.String()) {
		t.Errorf("the script asked from another address than the lease:\n%s\nwant no token, ask again, and no lease address", got)
	}
	if got := s.script(macRamdisk, lease, now); !strings.Contains(got, "bcd.token=") {
		t.Errorf("the script asked from the lease's address has no token:\n%s", got)
	}
}
