package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestJoinFromTheKernelCommandLine: a deployed system's first boot joins with what its deploy
// put on its kernel command line (URL, credential, hostname; flags win), and writes its lease
// holder's SSH keys; a malformed key list is refused before anything is joined.
func TestJoinFromTheKernelCommandLine(t *testing.T) {
	t.Parallel()
	e := newE2E(t, e2eOptions{NoGateway: true})
	bin, url, tok := e.Bin, e.URL, e.Token
	dir := t.TempDir()
	keys := []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice"}
	raw, _ := json.Marshal(keys)
	cmdline := filepath.Join(dir, "cmdline")
	authorized := filepath.Join(dir, "root", ".ssh", "authorized_keys")
	write := func(s string) {
		if err := os.WriteFile(cmdline, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("root=/dev/vda console=ttyS0 bcd.url=" + url + " bcd.join=" + tok.Token + " bcd.hostname=rack1-u07 bcd.ssh_keys=not-base64!\n")
	out, err := exec.Command(bin, "join", "--state-dir", filepath.Join(dir, "state"), "--cmdline", cmdline, "--authorized-keys", authorized).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bcd.ssh_keys") {
		t.Fatalf("a join with a malformed key list: %v\n%s", err, out)
	}
	write("root=/dev/vda console=ttyS0 bcd.url=" + url + " bcd.join=" + tok.Token + " bcd.hostname=rack1-u07 bcd.ssh_keys=" +
		base64.RawURLEncoding.EncodeToString(raw) + " -- bcd.hostname=not-this\n")
	out, err = exec.Command(bin, "join", "--state-dir", filepath.Join(dir, "state"), "--cmdline", cmdline, "--authorized-keys", authorized).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "joined as rack1-u07") {
		t.Fatalf("join --cmdline: %v\n%s", err, out)
	}
	if next := "now run: bcd node --state-dir " + filepath.Join(dir, "state"); !strings.Contains(string(out), next) {
		t.Errorf("join's hint is not %q:\n%s", next, out)
	}
	b, err := os.ReadFile(authorized)
	if err != nil || string(b) != keys[0]+"\n" {
		t.Fatalf("authorized_keys = %q, %v; want the holder's key", b, err)
	}
}
