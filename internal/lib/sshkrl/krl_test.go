package sshkrl_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/internal/lib/sshkrl"
)

// TestOpenSSHReadsTheKRL: OpenSSH's own ssh-keygen -Q reads a KRL this package wrote, and finds
// revoked exactly the certificates it lists, per certificate authority.
func TestOpenSSHReadsTheKRL(t *testing.T) {
	t.Parallel()
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Skip("ssh-keygen is not installed (Debian package openssh-client)")
	}
	dir := t.TempDir()
	newCA := func() ssh.Signer {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		s, _ := ssh.NewSignerFromKey(k)
		return s
	}
	caA, caB := newCA(), newCA()
	_, userKey, _ := ed25519.GenerateKey(rand.Reader)
	userPub, _ := ssh.NewPublicKey(userKey.Public())
	certFile := func(ca ssh.Signer, serial uint64) string {
		c := &ssh.Certificate{Key: userPub, Serial: serial, CertType: ssh.UserCert, KeyId: "k", ValidPrincipals: []string{"p"},
			ValidBefore: uint64(time.Now().Add(time.Hour).Unix())}
		if err := c.SignCert(rand.Reader, ca); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, fmt.Sprintf("cert-%p-%d.pub", ca, serial))
		if err := os.WriteFile(f, ssh.MarshalAuthorizedKey(c), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	krl := filepath.Join(dir, "revoked.krl")
	if err := os.WriteFile(krl, sshkrl.Write(7, time.Now(), []sshkrl.Revoked{{CA: caA.PublicKey(), Serials: []uint64{9, 3, 3, 12}}, {CA: caB.PublicKey(), Serials: []uint64{4}}}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ca      ssh.Signer
		serial  uint64
		revoked bool
	}{{caA, 3, true}, {caA, 9, true}, {caA, 12, true}, {caA, 4, false}, {caB, 4, true}, {caB, 3, false}} {
		out, _ := exec.Command(keygen, "-Q", "-f", krl, certFile(c.ca, c.serial)).CombinedOutput()
		if got := strings.Contains(string(out), "REVOKED"); got != c.revoked {
			t.Errorf("serial %d of CA %p: ssh-keygen says %q, want revoked %v", c.serial, c.ca, out, c.revoked)
		}
	}
	empty := filepath.Join(dir, "empty.krl")
	if err := os.WriteFile(empty, sshkrl.Write(0, time.Unix(0, 0), nil), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(keygen, "-Q", "-f", empty, certFile(caA, 3)).CombinedOutput(); err != nil || strings.Contains(string(out), "REVOKED") {
		t.Errorf("an empty KRL: %q, %v; want it read, nothing revoked", out, err)
	}
}
