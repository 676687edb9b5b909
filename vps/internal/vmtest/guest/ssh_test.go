package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/internal/lib/sshkrl"
)

// TestGuestSSHKeepsTheHandshake: the test guest's SSH on a serial line (a pseudo-terminal
// here) serves one session per handshake, each under the KRL of its own handshake: a
// certificate logs in, then is refused once a KRL revokes it, while another still logs in;
// a KRL that answers no challenge is not believed.
func TestGuestSSHKeepsTheHandshake(t *testing.T) {
	master, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { master.Close(); tty.Close() })
	ca := signer(t)
	const principal = "res-1"
	go serveSSH(tty.Name(), string(ssh.MarshalAuthorizedKey(ca.PublicKey())), principal, func(f string, a ...any) { t.Logf(f, a...) })

	h := newHost(master)
	a, b := cert(t, ca, principal, 1), cert(t, ca, principal, 2)
	none := sshkrl.Write(0, time.Unix(0, 0), nil)
	revokesA := sshkrl.Write(1, time.Unix(0, 0), []sshkrl.Revoked{{CA: ca.PublicKey(), Serials: []uint64{1}}})
	for i, step := range []struct {
		krl    []byte
		cert   ssh.Signer
		forged bool // a KRL line for a challenge never written goes first
		ok     bool
	}{{none, a, false, true}, {none, b, false, true}, {revokesA, a, false, false}, {revokesA, b, false, true},
		{revokesA, a, true, false}, {none, a, false, true}} {
		if step.forged {
			h.l.write("bc-ssh-krl 00112233445566778899aabbccddeeff " + base64.StdEncoding.EncodeToString(none) + "\n")
		}
		err := h.session(t, step.krl, step.cert, principal)
		if (err == nil) != step.ok {
			t.Fatalf("step %d: %v, want a login %v", i, err, step.ok)
		}
	}
}

// host is what the host agent does, by hand: the handshake, one SSH session, then on to the
// next. It reads the line as the guest does (a serialLine), so that a session's reader stops
// taking the line's bytes once its session is closed.
type host struct {
	l *serialLine
}

func newHost(master *os.File) *host {
	l := &serialLine{in: make(chan []byte, 64), w: master}
	go func() {
		for {
			b := make([]byte, 4096)
			n, err := master.Read(b)
			if err != nil {
				close(l.in)
				return
			}
			l.in <- b[:n]
		}
	}()
	return &host{l: l}
}

func (h *host) line(t *testing.T) string {
	t.Helper()
	s, ok := h.l.readLine()
	if !ok {
		t.Fatal("the line closed")
	}
	if i := strings.Index(s, "bc-ssh-"); i > 0 {
		s = s[i:]
	}
	return s
}

func (h *host) session(t *testing.T, krl []byte, cert ssh.Signer, user string) error {
	t.Helper()
	h.l.write("bc-ssh-hello\n")
	var g string
	for g == "" {
		if rest, ok := strings.CutPrefix(h.line(t), "bc-ssh-ready "); ok {
			g = rest
		}
	}
	h.l.write("bc-ssh-krl " + g + " " + base64.StdEncoding.EncodeToString(krl) + "\n")
	for h.line(t) != "bc-ssh-go "+g {
	}
	c := &lineConn{line: h.l, closed: make(chan struct{})}
	defer c.end() // what is left of the session, the next handshake skips
	sc, chans, reqs, err := ssh.NewClientConn(c, "guest", &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(cert)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
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

func signer(t *testing.T) ssh.Signer {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func cert(t *testing.T, ca ssh.Signer, principal string, serial uint64) ssh.Signer {
	user := signer(t)
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
