package pki_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

// TestGatewayCertificateIsRotated: the gateway's TLS configuration serves a new server
// certificate, for the same hosts, once two thirds of the current one's life have passed.
func TestGatewayCertificateIsRotated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, pki.Migrations)
	ca, err := pki.Load(ctx, db, secret)
	if err != nil {
		t.Fatal(err)
	}
	const life = 3 * time.Second
	cert, err := ca.IssueGatewayFor(ctx, "gw-1", []string{"127.0.0.1", "gw.example"}, life)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ca.ServerTLS(cert)
	if cfg.GetCertificate == nil {
		t.Fatal("the gateway's TLS configuration has a fixed certificate: it expires with the process still running")
	}
	serving := func() *x509.Certificate {
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf
	}
	if first := serving(); first.SerialNumber.Cmp(cert.Leaf.SerialNumber) != 0 {
		t.Fatal("a fresh certificate was replaced at once")
	}
	// Two thirds of its life from its issue, as the certificate itself says: the clock passing it
	// is what is under test.
	issued := cert.Leaf.NotBefore.Add(pki.IssuedEarly)
	<-time.After(time.Until(issued.Add(cert.Leaf.NotAfter.Sub(issued) * 2 / 3)))
	next := serving()
	if next.SerialNumber.Cmp(cert.Leaf.SerialNumber) == 0 {
		t.Fatal("the certificate was not reissued past two thirds of its life")
	}
	if next.NotAfter.Sub(next.NotBefore) != cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) ||
		len(next.DNSNames) != 1 || next.DNSNames[0] != "gw.example" || len(next.IPAddresses) != 1 ||
		next.Subject.CommonName != "gateway/gw-1" {
		t.Fatalf("the reissued certificate differs: %v %v %v %v..%v", next.Subject, next.DNSNames, next.IPAddresses, next.NotBefore, next.NotAfter)
	}
	if _, err := next.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "gw.example"}); err != nil {
		t.Fatalf("the reissued certificate does not verify: %v", err)
	}
	if again := serving(); again.SerialNumber.Cmp(next.SerialNumber) != 0 {
		t.Fatal("the certificate is reissued on every handshake")
	}
}

// TestRevocationsInMemory: the set knows what was revoked once loaded, per node or whole, and
// forgets nothing it should refuse.
func TestRevocationsInMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, pki.Migrations)
	ca, err := pki.Load(ctx, db, secret)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(node string) *x509.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		der, _, err := ca.IssueNode(ctx, db.Pool, node, "node", csr, 0)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c
	}
	a, b := issue("node-a"), issue("node-b")
	set := pki.NewRevocations()
	if set.Loaded() {
		t.Fatal("a new set claims to be loaded")
	}
	if err := set.Load(ctx, db.Pool); err != nil || !set.Loaded() || set.Len() != 0 {
		t.Fatalf("Load = %v, loaded %v, %d revoked", err, set.Loaded(), set.Len())
	}
	if _, err := pki.RevokeNode(ctx, db.Pool, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := set.LoadNode(ctx, db.Pool, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := set.CheckNode(a); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("CheckNode of a revoked certificate = %v", err)
	}
	if id, err := set.CheckNode(b); err != nil || id != "node-b" {
		t.Fatalf("CheckNode of a good certificate = %q, %v", id, err)
	}
	if _, err := pki.RevokeNode(ctx, db.Pool, "node-b"); err != nil {
		t.Fatal(err)
	}
	if err := set.Load(ctx, db.Pool); err != nil || !set.Revoked(pki.Serial(b)) || !set.Revoked(pki.Serial(a)) {
		t.Fatalf("a full reload misses revocations: %v", err)
	}
}
