package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/better-compute/compute/internal/lib/sshkrl"
)

// serveSSH serves SSH on a serial port, as a sandbox's guest does on its second one: user
// certificates of the CA caLine for the principal, unless the KRL its host gave revokes them,
// one exec per session. A serial line has no connections, so each session begins with the
// host's handshake (docs/sandboxes.md, "The guest's side"): the guest writes a fresh random
// challenge, believes only the KRL that answers it, says go, serves one SSH session, and writes
// the end marker before its next challenge.
func serveSSH(dev, caLine, principal string, say func(string, ...any)) {
	ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(caLine))
	if err != nil {
		say("bc-guest: ssh: the CA: %v", err)
		return
	}
	// Not blocking: a serial port's open waits for its carrier, which QEMU raises only while a
	// client is attached, and the first bytes of the first client would be gone by then.
	tty, err := os.OpenFile(dev, os.O_RDWR|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	if err != nil {
		say("bc-guest: ssh: %v", err)
		return
	}
	if _, err := term.MakeRaw(int(tty.Fd())); err != nil {
		say("bc-guest: ssh: raw %s: %v", dev, err)
		return
	}
	// As fast as a 16550 goes: QEMU paces a serial port by its baud rate, and the 9600 a port
	// starts at makes a handshake of a few KiB take seconds.
	if t, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS); err == nil {
		t.Cflag = t.Cflag&^unix.CBAUD | unix.B115200 | unix.CLOCAL // and no hangup when a client goes
		t.Ispeed, t.Ospeed = unix.B115200, unix.B115200
		_ = unix.IoctlSetTermios(int(tty.Fd()), unix.TCSETS, t)
	}
	line := &serialLine{in: make(chan []byte, 64), w: tty}
	go func() { // the one reader of the line: sessions take from it, and leave what they do not
		for {
			b := make([]byte, 4096)
			n, err := tty.Read(b)
			if err != nil {
				close(line.in)
				return
			}
			line.in <- b[:n]
		}
	}()
	// The line is read from here on, so a host that comes early waits rather than loses its
	// first bytes. The host key and the challenges need the kernel's random numbers, which a VM
	// without an RNG device has only some time after its boot: until then a host waits.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(priv)
	say("bc-guest: ssh on %s", dev)
	for {
		krl, ok := line.handshake(say)
		if !ok {
			return
		}
		checker := &ssh.CertChecker{
			IsUserAuthority: func(k ssh.PublicKey) bool { return bytes.Equal(k.Marshal(), ca.Marshal()) },
			IsRevoked:       func(c *ssh.Certificate) bool { return krl.IsRevoked(c) },
		}
		cfg := &ssh.ServerConfig{PublicKeyCallback: func(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if c.User() != principal {
				return nil, fmt.Errorf("user %q: this sandbox is %q's", c.User(), principal)
			}
			return checker.Authenticate(c, key)
		}}
		cfg.AddHostKey(host)
		c := &lineConn{line: line, closed: make(chan struct{})}
		// A client that stops halfway through its login does not hold the port (as sshd's
		// LoginGraceTime).
		grace := time.AfterFunc(time.Minute, func() { c.Close() })
		if err := serveConn(c, cfg, grace); err != nil {
			say("bc-guest: ssh: %v", err)
		}
		grace.Stop()
		c.end()
		line.write("\r\nbc-ssh-end\r\n") // before the next challenge: the host relays nothing after it
	}
}

// serialLine is the port: what its one reader read, and what is left of it.
type serialLine struct {
	in      chan []byte
	pending []byte
	mu      sync.Mutex // one writer at a time
	w       io.Writer
}

func (l *serialLine) write(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s)
}

// readLine returns the next line, without its end; of a line longer than 1 MiB, the end.
func (l *serialLine) readLine() (string, bool) {
	for {
		if i := bytes.IndexByte(l.pending, '\n'); i >= 0 {
			s := string(l.pending[:i])
			l.pending = l.pending[i+1:]
			return strings.TrimRight(s, "\r"), true
		}
		if len(l.pending) > 1<<20 {
			l.pending = nil
		}
		b, ok := <-l.in
		if !ok {
			return "", false
		}
		l.pending = append(l.pending, b...)
	}
}

// handshake writes a fresh challenge and waits for the KRL that answers it (saying the
// challenge again to each bc-ssh-hello), then says go. Anything else is skipped: the rest of a
// session before, or what its client wrote after it, which never saw the challenge.
func (l *serialLine) handshake(say func(string, ...any)) (*sshkrl.KRL, bool) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		say("bc-guest: ssh: %v", err)
		return nil, false
	}
	g := hex.EncodeToString(b[:])
	l.write("\r\nbc-ssh-ready " + g + "\r\n")
	for {
		s, ok := l.readLine()
		if !ok {
			return nil, false
		}
		if i := strings.Index(s, "bc-ssh-"); i > 0 {
			s = s[i:] // after what a session left on the line
		}
		if s == "bc-ssh-hello" {
			l.write("\r\nbc-ssh-ready " + g + "\r\n")
			continue
		}
		enc, ok := strings.CutPrefix(s, "bc-ssh-krl "+g+" ")
		if !ok {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(enc)
		var krl *sshkrl.KRL
		if err == nil {
			krl, err = sshkrl.Parse(raw)
		}
		if err != nil { // no session without the revocations
			say("bc-guest: ssh: the host's KRL: %v", err)
			continue
		}
		l.write("\r\nbc-ssh-go " + g + "\r\n")
		return krl, true
	}
}

// serveConn serves one SSH connection: its first session's exec, then the connection ends.
func serveConn(c net.Conn, cfg *ssh.ServerConfig, grace *time.Timer) error {
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return err
	}
	grace.Stop()
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return err
		}
		for r := range creqs {
			if r.Type != "exec" {
				r.Reply(r.Type == "env", nil)
				continue
			}
			var cmd struct{ Command string }
			if err := ssh.Unmarshal(r.Payload, &cmd); err != nil {
				r.Reply(false, nil)
				continue
			}
			r.Reply(true, nil)
			code := run(cmd.Command, ch, ch.Stderr())
			ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
			ch.Close()
			return nil
		}
	}
	return nil
}

// run is the guest's shell: the few commands the tests ask for.
func run(command string, stdout, stderr io.Writer) uint32 {
	f := strings.Fields(command)
	if len(f) == 0 {
		return 0
	}
	switch f[0] {
	case "echo":
		fmt.Fprintln(stdout, strings.Join(f[1:], " "))
		return 0
	case "hostname":
		h, _ := os.Hostname()
		fmt.Fprintln(stdout, h)
		return 0
	}
	fmt.Fprintf(stderr, "%s: command not found\n", f[0])
	return 127
}

// lineConn is one SSH session over the serial line.
type lineConn struct {
	line   *serialLine
	closed chan struct{}
	rmu    sync.Mutex // held by a Read: end waits for it
}

// Read reads the line; once the session is closed it reads nothing more, leaving the line's
// bytes to the next handshake.
func (c *lineConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	l := c.line
	for {
		select {
		case <-c.closed:
			return 0, io.EOF
		default:
		}
		if len(l.pending) > 0 {
			n := copy(p, l.pending)
			l.pending = l.pending[n:]
			return n, nil
		}
		select {
		case b, ok := <-l.in:
			if !ok {
				return 0, io.EOF
			}
			l.pending = append(l.pending, b...)
		case <-c.closed:
			return 0, io.EOF
		}
	}
}

// end closes the session and waits for a Read under way to return.
func (c *lineConn) end() {
	c.Close()
	c.rmu.Lock() // held by a Read under way: taking it waits for that Read to return
	//lint:ignore SA2001 the empty section is the wait
	c.rmu.Unlock()
}

func (c *lineConn) Write(p []byte) (int, error) {
	l := c.line
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-c.closed: // nothing of a session after it ended
		return 0, errors.New("closed")
	default:
	}
	return l.w.Write(p)
}

func (c *lineConn) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}

type lineAddr struct{}

func (lineAddr) Network() string { return "serial" }
func (lineAddr) String() string  { return "ttyS1" }

func (c *lineConn) LocalAddr() net.Addr              { return lineAddr{} }
func (c *lineConn) RemoteAddr() net.Addr             { return lineAddr{} }
func (c *lineConn) SetDeadline(time.Time) error      { return nil }
func (c *lineConn) SetReadDeadline(time.Time) error  { return nil }
func (c *lineConn) SetWriteDeadline(time.Time) error { return nil }
