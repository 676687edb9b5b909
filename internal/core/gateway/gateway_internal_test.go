package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/time/rate"
)

// TestSilentNodeOfflineWithin30s: whatever the fleet's size, a node that falls silent is past
// its grace, counted from the flush that wrote its last heartbeat (up to a flush after it), and
// taken offline by the worker's next tick (1 s), with a second to spare for that tick's work,
// within 30 s.
func TestSilentNodeOfflineWithin30s(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 1_000, 10_000, 100_000} {
		g := New(nil, Config{})
		for i := range n {
			g.sessions[fmt.Sprint(i)] = &session{}
		}
		interval := g.HeartbeatInterval()
		if worst := g.cfg.FlushInterval + g.grace(interval) + time.Second; worst > 29*time.Second {
			t.Errorf("%d sessions: interval %v, grace %v: a silent node is offline after up to %v, want ≤ 30s", n, interval, g.grace(interval), worst)
		}
	}
}

// untilToken waits on the clock until l has a token again, for as long as its own arithmetic says
// one takes to come back: no guessed pause. (This package's own tests cannot use computetest,
// which imports it.)
func untilToken(l *rate.Limiter) {
	for missing := 1 - l.Tokens(); missing > 0; missing = 1 - l.Tokens() {
		<-time.After(time.Duration(math.Ceil(missing / float64(l.Limit()) * float64(time.Second))))
	}
}

// TestAdmissionIsRateLimited: new sessions beyond the burst are refused as unavailable (which
// agents retry) until tokens come back.
func TestAdmissionIsRateLimited(t *testing.T) {
	t.Parallel()
	g := New(nil, Config{AdmitRate: 2, AdmitBurst: 3}) // a token every 500 ms: the burst is spent before one comes back, even on a loaded machine
	for i := range 3 {
		if err := g.admit(); err != nil {
			t.Fatalf("session %d of a burst of 3 refused: %v", i, err)
		}
	}
	err := g.admit()
	if connect.CodeOf(err) != connect.CodeUnavailable || !errors.Is(err, ErrBusy) {
		t.Fatalf("a 4th session at once: %v, want unavailable (busy)", err)
	}
	untilToken(g.admission)
	if err := g.admit(); err != nil {
		t.Fatalf("a session after a token came back refused: %v", err)
	}
}

// TestHandshakesBeyondTheRateAreRefusedBeforeTheirCryptography: a TLS handshake beyond the
// admission burst fails at once, the server having sent no certificate, and one is accepted
// again when a token has come back.
func TestHandshakesBeyondTheRateAreRefusedBeforeTheirCryptography(t *testing.T) {
	t.Parallel()
	g := New(nil, Config{AdmitRate: 2, AdmitBurst: 3}) // a token every 500 ms: the burst is spent before one comes back, even on a loaded machine
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates:       []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		GetConfigForClient: g.AdmitHandshake,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	dial := func() (*tls.Conn, error) {
		return tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	}
	for i := range 3 {
		c, err := dial()
		if err != nil {
			t.Fatalf("handshake %d of a burst of 3 refused: %v", i, err)
		}
		c.Close()
	}
	c, err := dial()
	if err == nil {
		c.Close()
		t.Fatal("a 4th handshake at once was accepted")
	}
	// The server's alert, sent right after the ClientHello (the client saw no certificate).
	if !strings.Contains(err.Error(), "remote error: tls: internal error") {
		t.Fatalf("the 4th handshake failed with %v, want the server's alert", err)
	}
	untilToken(g.handshakes)
	if c, err := dial(); err != nil {
		t.Fatalf("a handshake after a token came back refused: %v", err)
	} else {
		c.Close()
	}
}
