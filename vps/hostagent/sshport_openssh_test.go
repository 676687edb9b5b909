package hostagent

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/computetest"
)

// TestSSHPortServesOpenSSH: the wrapper docs/sandboxes.md gives images with OpenSSH, on a
// serial line (a pseudo-terminal here, behind a socket as QEMU's), reached through the agent's
// port, with a real sshd -i per session: certificates of the CA log in, and one is refused once
// the agent's KRL revokes it, while the other logs in still.
func TestSSHPortServesOpenSSH(t *testing.T) {
	t.Parallel()
	const sshd = "/usr/sbin/sshd"
	if _, err := os.Stat(sshd); err != nil {
		t.Skip("OpenSSH's sshd is not installed (Debian package openssh-server; .ci/run installs it)")
	}
	if os.Getuid() != 0 {
		t.Skip("sshd runs as root to log users in")
	}
	for _, tool := range []string{"sh", "stty", "od", "tr", "base64", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	script := write("bc-ssh-serial", wrapperFromDocs(t))
	ca := newTestSigner(t)
	const principal = "res-test"
	hostKey := filepath.Join(dir, "host_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	krl := filepath.Join(dir, "bc_revoked_keys")
	cfg := write("sshd_config", []byte(strings.Join([]string{
		"HostKey " + hostKey, "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
		"AuthorizedKeysFile none", "StrictModes no", "LoginGraceTime 30",
		"TrustedUserCAKeys " + write("ca.pub", ssh.MarshalAuthorizedKey(ca.PublicKey())),
		"AuthorizedPrincipalsFile " + write("principals", []byte(principal+"\n")),
		"RevokedKeys " + krl,
	}, "\n")+"\n"))
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege-separation directory
		t.Fatal(err)
	}

	master, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { master.Close(); tty.Close() })
	a := testAgent(t)
	bridge(t, a.guestPortPath("sbx"), master)
	var log computetest.Buffer // the wrapper's and sshd's stderr
	wrapper := exec.Command("sh", script)
	wrapper.Env = append(os.Environ(), "BC_SSH_TTY="+tty.Name(), "BC_SSH_KRL="+krl, "BC_SSHD="+sshd+" -e -f "+cfg)
	wrapper.Stderr = &log
	wrapper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // it and the sshd it runs, ended together
	if err := wrapper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-wrapper.Process.Pid, syscall.SIGKILL)
		_ = wrapper.Wait()
		if t.Failed() {
			t.Logf("the wrapper and sshd said:\n%s", log.String())
		}
	})

	login := func(cert ssh.Signer) error {
		t.Helper()
		c, err := net.Dial("unix", a.agentPath("sbx"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(45 * time.Second))
		sc, chans, reqs, err := ssh.NewClientConn(c, "sandbox", &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(cert)},
			HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 30 * time.Second})
		if err != nil {
			return err
		}
		cli := ssh.NewClient(sc, chans, reqs)
		defer cli.Close()
		sess, err := cli.NewSession()
		if err != nil {
			return err
		}
		out, err := sess.Output("echo hi")
		if err == nil && string(out) != "hi\n" {
			err = errors.New("echo answered " + string(out))
		}
		return err
	}
	// The KRLs, as ssh-keygen writes them.
	caFile := filepath.Join(dir, "ca.pub")
	makeKRL := func(spec string) []byte {
		t.Helper()
		f := filepath.Join(dir, "made.krl")
		_ = os.Remove(f)
		args := []string{"-k", "-f", f}
		if spec != "" {
			args = append(args, "-s", caFile, write("spec", []byte(spec+"\n")))
		}
		if out, err := exec.Command("ssh-keygen", args...).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen -k: %v\n%s", err, out)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first, second := testCert(t, ca, principal, 7), testCert(t, ca, principal, 8)
	a.serveSSHPorts(map[string][]byte{"sbx": makeKRL("")})
	for i, c := range []ssh.Signer{first, second} {
		if err := login(c); err != nil {
			t.Fatalf("certificate %d before any revocation: %v", i, err)
		}
	}
	a.serveSSHPorts(map[string][]byte{"sbx": makeKRL("serial: 7")})
	if err := login(first); err == nil {
		t.Fatal("sshd let a revoked certificate in")
	}
	if err := login(second); err != nil {
		t.Fatalf("another certificate after a revocation: %v", err)
	}
}

// wrapperFromDocs is the script docs/sandboxes.md gives, as it gives it.
func wrapperFromDocs(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile("../../docs/sandboxes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- bc-ssh-serial -->\n```sh\n")
	script, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatal("docs/sandboxes.md has no bc-ssh-serial script")
	}
	return []byte(script)
}

// bridge serves a terminal's master at path as QEMU serves a serial port: one client at a time;
// the client's bytes to the terminal, the terminal's to the client attached then or to nobody.
func bridge(t *testing.T, path string, master *os.File) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var attached net.Conn
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			if err != nil {
				return
			}
			mu.Lock()
			if attached != nil {
				_, _ = attached.Write(b[:n])
			}
			mu.Unlock()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			attached = c
			mu.Unlock()
			b := make([]byte, 4096)
			for {
				n, err := c.Read(b)
				if n > 0 {
					_, _ = master.Write(b[:n])
				}
				if err != nil {
					break
				}
			}
			mu.Lock()
			attached = nil
			mu.Unlock()
			c.Close()
		}
	}()
}

func newTestSigner(t *testing.T) ssh.Signer {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testCert(t *testing.T, ca ssh.Signer, principal string, serial uint64) ssh.Signer {
	user := newTestSigner(t)
	c := &ssh.Certificate{Key: user.PublicKey(), Serial: serial, CertType: ssh.UserCert, KeyId: "k", ValidPrincipals: []string{principal},
		ValidAfter: uint64(time.Now().Add(-time.Minute).Unix()), ValidBefore: uint64(time.Now().Add(time.Hour).Unix())}
	if err := c.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewCertSigner(c, user)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
