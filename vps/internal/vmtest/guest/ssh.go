package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// serveSSH serves SSH on a serial port, as a sandbox's guest does on its second one: user
// certificates of the CA caLine for the principal, one exec per connection. A serial line has
// no connections: a client's begins with its "SSH-" version line, which the guest waits for.
func serveSSH(dev, caLine, principal string, say func(string, ...any)) {
	ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(caLine))
	if err != nil {
		say("bc-guest: ssh: the CA: %v", err)
		return
	}
	checker := &ssh.CertChecker{IsUserAuthority: func(k ssh.PublicKey) bool { return bytes.Equal(k.Marshal(), ca.Marshal()) }}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(c ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
		if c.User() != principal {
			return nil, fmt.Errorf("user %q: this sandbox is %q's", c.User(), principal)
		}
		return checker.Authenticate(c, key)
	}}
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
	in := make(chan []byte, 64)
	go func() { // the one reader of the line: connections take from it, and leave what they do not
		for {
			b := make([]byte, 4096)
			n, err := tty.Read(b)
			if err != nil {
				close(in)
				return
			}
			in <- b[:n]
		}
	}()
	// The line is read from here on, so a client that comes early waits rather than loses its
	// first bytes. The host key needs the kernel's random numbers, which a VM without an RNG
	// device has only some time after its boot: until then a client waits for the answer.
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	host, _ := ssh.NewSignerFromKey(priv)
	cfg.AddHostKey(host)
	say("bc-guest: ssh on %s", dev)
	for {
		first, ok := awaitVersion(in)
		if !ok {
			return
		}
		c := &lineConn{in: in, pending: first, w: tty, closed: make(chan struct{})}
		if err := serveConn(c, cfg); err != nil {
			say("bc-guest: ssh: %v", err)
		}
		c.Close()
	}
}

// awaitVersion discards what comes before "SSH-" (what a previous connection left on the line)
// and returns it and what follows.
func awaitVersion(in chan []byte) ([]byte, bool) {
	var seen []byte
	for b := range in {
		seen = append(seen, b...)
		if i := bytes.Index(seen, []byte("SSH-")); i >= 0 {
			return seen[i:], true
		}
		if len(seen) > 3 {
			seen = seen[len(seen)-3:]
		}
	}
	return nil, false
}

// serveConn serves one SSH connection: its first session's exec, then the connection ends.
func serveConn(c net.Conn, cfg *ssh.ServerConfig) error {
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return err
	}
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

// lineConn is one SSH connection over the serial line.
type lineConn struct {
	in      chan []byte
	pending []byte
	w       io.Writer
	closed  chan struct{}
}

func (c *lineConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		select {
		case b, ok := <-c.in:
			if !ok {
				return 0, io.EOF
			}
			c.pending = b
		case <-c.closed:
			return 0, io.EOF
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *lineConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, errors.New("closed")
	default:
	}
	return c.w.Write(p)
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
