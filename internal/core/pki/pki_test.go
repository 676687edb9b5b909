package pki_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const secret = "pki-test-secret-0123456789abcdefgh"

func TestOneCAForConcurrentLoadsAndTheSecretGuardsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, pki.Migrations)
	var wg sync.WaitGroup
	cas := make([]*pki.Authority, 4)
	errs := make([]error, 4)
	for i := range cas {
		wg.Add(1)
		go func() { defer wg.Done(); cas[i], errs[i] = pki.Load(ctx, db, secret) }()
	}
	wg.Wait()
	for i := range cas {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !cas[i].Certificate().Equal(cas[0].Certificate()) {
			t.Fatal("processes loading at once ended up with different CAs")
		}
	}
	var sealed []byte
	if err := db.Pool.QueryRow(ctx, `SELECT encrypted_key FROM compute.pki_authority`).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if _, err := x509.ParsePKCS8PrivateKey(sealed); err == nil {
		t.Fatal("the CA key is stored in the clear")
	}
	_, err := pki.Load(ctx, db, "another-secret-of-enough-length-000")
	if err == nil || !strings.Contains(err.Error(), "Options.Secret") {
		t.Fatalf("loading with another secret = %v, want an error naming the secret", err)
	}
}

func TestIssueCheckRevoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, postgres.Core, pki.Migrations)
	ca, err := pki.Load(ctx, db, secret)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	der, _, err := ca.IssueNode(ctx, db.Pool, "node-1", "node", csr, 0)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("the node certificate does not verify against the CA: %v", err)
	}
	if id, err := ca.Check(ctx, cert); err != nil || id != "node-1" {
		t.Fatalf("Check = %q, %v", id, err)
	}
	if _, err := pki.RevokeNode(ctx, db.Pool, "node-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Check(ctx, cert); !errors.Is(err, pki.ErrRevoked) {
		t.Fatalf("Check after revocation = %v, want ErrRevoked", err)
	}
	// A CSR whose signature was tampered with is refused.
	bad := append([]byte(nil), csr...)
	bad[len(bad)-3] ^= 0xff
	if _, _, err := ca.IssueNode(ctx, db.Pool, "node-2", "node", bad, 0); err == nil {
		t.Fatal("a tampered CSR was signed")
	}
}
