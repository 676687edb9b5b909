package sshd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
)

// TestHoldersLogInByCertificateAlone: the configuration bcd writes, included by a real sshd's,
// gives a holder's user no authorized_keys (nor AuthorizedKeysCommand): a key the holder wrote
// into its own home would let it in past its certificates' revocation. The operator login, and
// every other user of the host, keep the host's own settings.
func TestHoldersLogInByCertificateAlone(t *testing.T) {
	bin := "/usr/sbin/sshd"
	if _, err := os.Stat(bin); err != nil {
		t.Skip("OpenSSH's sshd is not installed (Debian package openssh-server; .ci/run installs it)")
	}
	dir := t.TempDir()
	if _, err := New(filepath.Join(dir, "bc"), "root", nil); err != nil {
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "host_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Skipf("ssh-keygen: %v %s", err, out)
	}
	main := filepath.Join(dir, "sshd_config")
	conf := "Include " + filepath.Join(dir, "bc", ConfigSnippet) + "\nHostKey " + hostKey + "\nPasswordAuthentication yes\n"
	if err := os.WriteFile(main, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	effective := func(user string) string {
		out, err := exec.Command(bin, "-f", main, "-T", "-C", "user="+user+",host=h,addr=192.0.2.1").CombinedOutput()
		if err != nil {
			t.Fatalf("sshd -T for %s: %v\n%s", user, err, out)
		}
		return string(bytes.ToLower(out))
	}
	holder := effective(api.ReservationUser("0190aaaa-bbbb"))
	for _, want := range []string{"authorizedkeysfile none", "authorizedkeyscommand none", "passwordauthentication yes"} {
		if !strings.Contains(holder, want+"\n") {
			t.Errorf("a holder's sshd settings lack %q:\n%s", want, holder)
		}
	}
	if root := effective("root"); strings.Contains(root, "authorizedkeysfile none\n") || !strings.Contains(root, "passwordauthentication yes\n") {
		t.Errorf("the operator login's sshd settings changed:\n%s", root)
	}
}
