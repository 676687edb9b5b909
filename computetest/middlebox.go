package computetest

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Middlebox is a TCP proxy on loopback in front of a gateway that lets only HTTP/1.1 through, as
// some corporate firewalls and proxies do: it reads each connection's TLS ClientHello and closes
// the connection when it offers HTTP/2 (ALPN h2), which is how gRPC dials; any other connection
// is passed through byte for byte, so mutual TLS stays between the node and the gateway. A node
// reaches the gateway through it only over the WebSocket fallback.
type Middlebox struct {
	// Addr is the proxy's address, for nodes to dial as their gateway.
	Addr string

	refused, passed atomic.Int64
}

// Refused is how many connections the middlebox closed for offering HTTP/2.
func (m *Middlebox) Refused() int64 { return m.refused.Load() }

// Passed is how many connections it passed through to the gateway.
func (m *Middlebox) Passed() int64 { return m.passed.Load() }

// BlockHTTP2 starts a Middlebox in front of the gateway at addr until the test ends.
func BlockHTTP2(t testing.TB, addr string) *Middlebox {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("computetest: middlebox: %v", err)
	}
	m := &Middlebox{Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer track(c, false)
				defer c.Close()
				m.relay(c, addr, track)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return m
}

// relay reads c's ClientHello and either closes c (it offers h2) or relays it to addr.
func (m *Middlebox) relay(c net.Conn, addr string, track func(net.Conn, bool)) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	hello, protos, err := readClientHello(c)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if slices.Contains(protos, "h2") {
		m.refused.Add(1)
		return
	}
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	track(up, true)
	defer track(up, false)
	defer up.Close()
	m.passed.Add(1)
	if _, err := up.Write(hello); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(c, up)
		c.Close()
	}()
	_, _ = io.Copy(up, c)
	up.Close()
	<-done
}

// errHelloRead stops the handshake readClientHello borrows once the ClientHello is read.
var errHelloRead = errors.New("client hello read")

// readClientHello reads a TLS ClientHello from c and returns its bytes and the application
// protocols it offers, having written nothing to c: crypto/tls parses it, and the handshake is
// abandoned as soon as it has.
func readClientHello(c net.Conn) ([]byte, []string, error) {
	rec := &recorder{Conn: c}
	var protos []string
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		protos = h.SupportedProtos
		return nil, errHelloRead
	}}).Handshake()
	if !errors.Is(err, errHelloRead) {
		return nil, nil, err
	}
	return rec.buf.Bytes(), protos, nil
}

// recorder keeps what is read from a connection and writes nothing to it.
type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (r *recorder) Write(p []byte) (int, error) { return len(p), nil }
