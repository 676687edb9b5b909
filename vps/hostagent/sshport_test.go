package hostagent

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakePort is a runtime's serial port socket (QEMU's chardev) with a guest that keeps the
// contract of docs/sandboxes.md: one client at a time; what a client writes reaches the guest's
// one line, what the guest writes reaches the client attached then, or nobody.
type fakePort struct {
	t  *testing.T
	ln net.Listener

	mu       sync.Mutex
	attached net.Conn
	accepted [][]byte // the KRLs the guest believed, in order
	sessions []string // what each session read
	seen     []string // every challenge the guest wrote
	in       chan []byte
}

func newFakePort(t *testing.T, path string) *fakePort {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePort{t: t, ln: ln, in: make(chan []byte, 1024)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.attached = c
			p.mu.Unlock()
			for {
				b := make([]byte, 512)
				n, err := c.Read(b)
				if n > 0 {
					p.in <- b[:n]
				}
				if err != nil {
					break
				}
			}
			p.mu.Lock()
			p.attached = nil
			p.mu.Unlock()
			c.Close()
		}
	}()
	go p.guest()
	return p
}

func (p *fakePort) write(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.attached != nil {
		_, _ = io.WriteString(p.attached, s)
	}
}

// guest: a challenge, the KRL that answers it, go, a session of one line (echoed back with
// "you said"), the end marker; again.
func (p *fakePort) guest() {
	var pending []byte
	line := func() string {
		for {
			if i := bytes.IndexByte(pending, '\n'); i >= 0 {
				s := string(pending[:i])
				pending = pending[i+1:]
				return strings.TrimRight(s, "\r")
			}
			pending = append(pending, <-p.in...)
		}
	}
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		g := hex.EncodeToString(b[:])
		p.mu.Lock()
		p.seen = append(p.seen, g)
		p.mu.Unlock()
		p.write("\r\nbc-ssh-ready " + g + "\r\n")
		for {
			s := line()
			if i := strings.Index(s, "bc-ssh-"); i > 0 {
				s = s[i:]
			}
			if s == "bc-ssh-hello" {
				p.write("\r\nbc-ssh-ready " + g + "\r\n")
				continue
			}
			if enc, ok := strings.CutPrefix(s, "bc-ssh-krl "+g+" "); ok {
				krl, err := base64.StdEncoding.DecodeString(enc)
				if err != nil {
					continue
				}
				p.mu.Lock()
				p.accepted = append(p.accepted, krl)
				p.mu.Unlock()
				break
			}
		}
		p.write("\r\nbc-ssh-go " + g + "\r\n")
		s := line()
		p.mu.Lock()
		p.sessions = append(p.sessions, s)
		p.mu.Unlock()
		p.write("you said " + s + "\n")
		p.write("\r\nbc-ssh-end\r\n")
	}
}

func (p *fakePort) state() (accepted [][]byte, sessions, seen []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.accepted...), append([]string(nil), p.sessions...), append([]string(nil), p.seen...)
}

func testAgent(t *testing.T) *Agent {
	dir, err := os.MkdirTemp("", "sshport") // short: Unix sockets' paths are
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.MkdirAll(dir+"/consoles", 0o755); err != nil {
		t.Fatal(err)
	}
	return &Agent{opts: Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)}, sshPorts: map[string]*sshPort{}}
}

// TestSSHPortHandsTheGuestItsKRL: each client of a sandbox's SSH port reaches its guest only
// once the guest holds the latest KRL the agent was given; the client sees nothing the guest
// wrote outside its session; the port goes with its instance.
func TestSSHPortHandsTheGuestItsKRL(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	port := newFakePort(t, a.guestPortPath("sbx"))
	a.serveSSHPorts(map[string][]byte{"sbx": []byte("krl one")})
	talk := func(say string) string {
		t.Helper()
		c, err := net.Dial("unix", a.agentPath("sbx"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, say+"\n"); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(c) // the agent closes it when the guest's session ends
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got := talk("hello"); got != "you said hello\n" {
		t.Fatalf("the client read %q, want only its session's bytes", got)
	}
	// A client that goes away in its session (as one the guest refused does) does not hold the
	// port: the next one is served.
	gone, err := net.Dial("unix", a.agentPath("sbx"))
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	a.serveSSHPorts(map[string][]byte{"sbx": []byte("krl two")})
	if got := talk("again"); got != "you said again\n" {
		t.Fatalf("the client after one that went away read %q", got)
	}
	accepted, sessions, _ := port.state()
	if n := len(accepted); n < 2 || string(accepted[0]) != "krl one" || string(accepted[n-1]) != "krl two" {
		t.Fatalf("the guest believed %q, want each session's latest KRL", accepted)
	}
	if n := len(sessions); n < 2 || sessions[0] != "hello" || sessions[n-1] != "again" {
		t.Fatalf("the guest's sessions read %q", sessions)
	}
	a.serveSSHPorts(nil)
	if _, err := net.Dial("unix", a.agentPath("sbx")); err == nil {
		t.Fatal("the port of an instance no longer wanted still answers")
	}
}

// TestSSHPortClientsCannotForgeTheKRL, a property over what clients write: whatever a client
// sends after its session (lines that look like the handshake's, with challenges guessed or
// seen before, random bytes, an answer to any challenge it reads), the guest believes no KRL but
// the agent's, and no client reads a challenge.
func TestSSHPortClientsCannotForgeTheKRL(t *testing.T) {
	t.Parallel()
	a := testAgent(t)
	port := newFakePort(t, a.guestPortPath("sbx"))
	const real = "the agent's KRL"
	a.serveSSHPorts(map[string][]byte{"sbx": []byte(real)})
	forged := base64.StdEncoding.EncodeToString([]byte("forged"))
	for seed := range uint64(40) {
		rng := mrand.New(mrand.NewPCG(seed, 1))
		c, err := net.Dial("unix", a.agentPath("sbx"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		var w bytes.Buffer
		fmt.Fprintf(&w, "session %d\n", seed)
		_, _, seen := port.state()
		for range 1 + rng.IntN(6) {
			switch rng.IntN(5) {
			case 0:
				w.WriteString("bc-ssh-hello\n")
			case 1: // a challenge seen before (none reached a client; as if one had)
				fmt.Fprintf(&w, "bc-ssh-krl %s %s\n", seen[rng.IntN(len(seen))], forged)
			case 2:
				fmt.Fprintf(&w, "\r\nbc-ssh-krl %032x %s\r\n", rng.Uint64(), forged)
			case 3:
				b := make([]byte, rng.IntN(300))
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				w.Write(b)
			case 4:
				fmt.Fprintf(&w, "bc-ssh-go %s\n", seen[rng.IntN(len(seen))])
			}
		}
		if _, err := c.Write(w.Bytes()); err != nil {
			t.Fatal(err)
		}
		// And it answers any challenge it reads, as the guest's host would.
		var got []byte
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			for _, l := range strings.Split(string(got), "\n") {
				if _, g, ok := strings.Cut(l, "bc-ssh-ready "); ok {
					fmt.Fprintf(c, "bc-ssh-krl %s %s\n", strings.TrimSpace(g), forged)
				}
			}
			if err != nil {
				break
			}
		}
		c.Close()
		if want := fmt.Sprintf("you said session %d\n", seed); string(got) != want {
			t.Fatalf("seed %d: the client read %.300q, want %q", seed, got, want)
		}
	}
	accepted, sessions, _ := port.state()
	for i, k := range accepted {
		if string(k) != real {
			t.Fatalf("session %d: the guest believed the KRL %q", i, k)
		}
	}
	if len(sessions) != 40 {
		t.Fatalf("%d sessions, want one per client", len(sessions))
	}
}

// TestCopySessionStopsAtTheMarker, a property over where the guest's reads split: what
// precedes the end marker reaches the client whole and at once, nothing after it ever does.
func TestCopySessionStopsAtTheMarker(t *testing.T) {
	t.Parallel()
	for seed := range uint64(500) {
		rng := mrand.New(mrand.NewPCG(seed, 2))
		before := make([]byte, rng.IntN(200))
		for i := range before {
			before[i] = "\r\nbc-sh\x00x"[rng.IntN(9)] // the marker's own letters, to tease it
		}
		stream := append(append(append([]byte(nil), before...), sshMarker+"ready secret\r\n"...), "more secret"...)
		want := stream[:bytes.Index(stream, []byte(sshMarker))]
		var chunks [][]byte
		for rest := stream; len(rest) > 0; {
			n := 1 + rng.IntN(min(len(rest), 16))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		var out bytes.Buffer
		if err := copySession(&out, &chunkReader{chunks: chunks}); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		got := out.Bytes()
		if !bytes.HasPrefix(got, want) || !bytes.HasPrefix([]byte(sshMarker), got[len(want):]) {
			t.Fatalf("seed %d: the client read %q, want %q and at most part of the marker", seed, got, want)
		}
	}
}

type chunkReader struct{ chunks [][]byte }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if len(r.chunks[0]) == 0 {
		r.chunks = r.chunks[1:]
	}
	return n, nil
}
