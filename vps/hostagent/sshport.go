package hostagent

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// A sandbox's guest serves SSH on its second serial port and trusts its tenant's CA itself, so
// the agent hands it the revocations (hostapi.Instance.SSHRevoked) before each connection: the
// socket access.console dials (agentPath) is the agent's, and for each client the agent dials
// the runtime's (guestPortPath), gives the guest the latest KRL, and only then relays the
// client's bytes. docs/sandboxes.md has the guest's side.
//
// A serial line has no connections: what one client writes after its SSH session ended reaches
// the guest as the next one's bytes would. So the guest believes only the KRL that answers a
// fresh random challenge it wrote towards the host, and the agent never lets a client see one:
// nothing the guest writes before its session starts is relayed, and the first bc-ssh- line
// the guest writes in a session (it writes "\r\nbc-ssh-end\r\n" when the session ends, before
// its next challenge) ends the relay in both directions.
const (
	sshHello  = "bc-ssh-hello"  // agent → guest: say your challenge
	sshReady  = "bc-ssh-ready " // guest → agent: + challenge
	sshKRL    = "bc-ssh-krl "   // agent → guest: + challenge + " " + base64 of the KRL
	sshGo     = "bc-ssh-go "    // guest → agent: + challenge; the session's bytes follow
	sshMarker = "\r\nbc-ssh-"   // guest → agent in a session: the session ended

	// sshHandshake bounds how long a client waits for a guest that does not answer (still
	// booting, paused, or not serving the port).
	sshHandshake = 30 * time.Second
	// sshLineMax bounds a line the guest writes before its session; longer ones are skipped.
	sshLineMax = 4096
)

// guestPortPath is where the runtime serves an instance's second serial port (ttyS1); the
// agent alone dials it. Short, as a Unix socket's path must be.
func (a *Agent) guestPortPath(id string) string {
	return filepath.Join(a.opts.Dir, "consoles", id+".s1")
}

// sshPort is the agent's socket for one instance's second serial port.
type sshPort struct {
	ln net.Listener

	mu  sync.Mutex
	krl []byte // the latest vps.instances gave
}

func (p *sshPort) revoked() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.krl
}

// serveSSHPorts serves the second serial port of exactly the instances in wanted (instance →
// its KRL) and gives each its latest KRL; a.mu is held.
func (a *Agent) serveSSHPorts(wanted map[string][]byte) {
	for id, p := range a.sshPorts {
		if _, ok := wanted[id]; !ok {
			p.ln.Close() // and its socket goes
			delete(a.sshPorts, id)
		}
	}
	for id, krl := range wanted {
		p := a.sshPorts[id]
		if p == nil {
			path := a.agentPath(id)
			_ = os.Remove(path) // a socket an earlier run of the agent left
			ln, err := net.Listen("unix", path)
			if err == nil {
				err = os.Chmod(path, 0o600) // bcd's alone: a ticket's way in, never a local user's
				if err != nil {
					ln.Close()
				}
			}
			if err != nil {
				a.opts.Logger.Warn("vps: serve a sandbox's SSH port", "instance", id, "err", err)
				continue
			}
			p = &sshPort{ln: ln}
			a.sshPorts[id] = p
			go a.acceptSSH(id, p)
		}
		p.mu.Lock()
		p.krl = krl
		p.mu.Unlock()
	}
}

// acceptSSH relays the port's clients one after the other, as the guest serves one session at
// a time: a client waits for the one before it.
func (a *Agent) acceptSSH(id string, p *sshPort) {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the port is no longer served
		}
		if err := relaySSH(c, a.guestPortPath(id), p.revoked()); err != nil {
			a.opts.Logger.Info("vps: a sandbox's SSH connection", "instance", id, "err", err)
		}
	}
}

// relaySSH gives the guest behind the serial port at guestPath the KRL, then relays client and
// guest until either ends or the guest's session does. It closes client.
func relaySSH(client net.Conn, guestPath string, krl []byte) error {
	defer client.Close()
	guest, err := net.DialTimeout("unix", guestPath, 5*time.Second)
	if err != nil {
		return fmt.Errorf("the guest's port: %w", err)
	}
	defer guest.Close()
	_ = guest.SetDeadline(time.Now().Add(sshHandshake))
	if _, err := io.WriteString(guest, sshHello+"\n"); err != nil {
		return err
	}
	r := bufio.NewReaderSize(guest, sshLineMax)
	if err := handshake(guest, r, krl); err != nil {
		return err
	}
	_ = guest.SetDeadline(time.Time{})

	// Either side ending ends the other: no byte of the client reaches the guest after its
	// session, nor the guest's next challenge the client; and a client that went away does not
	// hold the port (the guest's session, if it waits on, is ended by the next handshake).
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(guest, client)
		guest.Close()
	}()
	err = copySession(client, r)
	client.Close()
	guest.Close()
	<-done
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// handshake answers each challenge the guest writes with the KRL, until the guest says it
// holds the KRL of a challenge answered.
func handshake(guest io.Writer, r *bufio.Reader, krl []byte) error {
	answered := map[string]bool{}
	line := base64.StdEncoding.EncodeToString(krl)
	for {
		l, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) { // not a line of the handshake: skipped whole
				_, err = r.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("the guest did not start a session: %w", err)
		}
		text := strings.TrimRight(string(l), "\r\n")
		if i := strings.Index(text, "bc-ssh-"); i > 0 {
			text = text[i:] // after what a session left on the line
		}
		switch {
		case strings.HasPrefix(text, sshReady):
			g := strings.TrimPrefix(text, sshReady)
			if !validChallenge(g) || answered[g] {
				continue
			}
			answered[g] = true
			if _, err := io.WriteString(guest, sshKRL+g+" "+line+"\n"); err != nil {
				return err
			}
		case strings.HasPrefix(text, sshGo):
			if answered[strings.TrimPrefix(text, sshGo)] {
				return nil
			}
		}
	}
}

// validChallenge: 16 to 64 hex digits (the guest's contract asks for 32, 128 random bits).
func validChallenge(g string) bool {
	if len(g) < 16 || len(g) > 64 {
		return false
	}
	for _, c := range g {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// copySession copies the guest's session to the client until sshMarker, which ends it: what
// comes before the marker is relayed at once (a byte held back could stall the SSH exchange),
// nothing from the marker's last byte on.
func copySession(client io.Writer, r io.Reader) error {
	marker := []byte(sshMarker)
	buf := make([]byte, 32<<10)
	var tail []byte // the last bytes relayed, to find a marker split between reads
	for {
		n, err := r.Read(buf)
		if n > 0 {
			seen := append(tail, buf[:n]...)
			if i := bytes.Index(seen, marker); i >= 0 {
				if i > len(tail) { // what precedes the marker and was not relayed yet
					_, _ = client.Write(buf[:i-len(tail)])
				}
				return nil
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return werr
			}
			tail = append([]byte(nil), seen[max(0, len(seen)-len(marker)+1):]...)
		}
		if err != nil {
			return err
		}
	}
}
