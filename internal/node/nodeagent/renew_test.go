package nodeagent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return testCA{cert, key}
}

// issue signs a client certificate for the key in keyDER, valid from notBefore to notAfter.
func (ca testCA) issue(t *testing.T, keyDER []byte, notBefore, notAfter time.Time) []byte {
	t.Helper()
	k, _ := x509.ParsePKCS8PrivateKey(keyDER)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.(*ecdsa.PrivateKey).PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestRenewedCertificateIsChecked: a renewed certificate for another key, from another CA, or
// not valid now is refused; the right one is accepted.
func TestRenewedCertificateIsChecked(t *testing.T) {
	t.Parallel()
	ca, rogue := newTestCA(t), newTestCA(t)
	key, _, _ := NewKey()
	otherKey, _, _ := NewKey()
	now := time.Now()
	id := Identity{CADER: [][]byte{ca.cert.Raw}}
	cases := []struct {
		name, want string
		cert       []byte
	}{
		{"good", "", ca.issue(t, key, now.Add(-time.Minute), now.Add(time.Hour))},
		{"another key", "not for this node's key", ca.issue(t, otherKey, now.Add(-time.Minute), now.Add(time.Hour))},
		{"another CA", "machine CA", rogue.issue(t, key, now.Add(-time.Minute), now.Add(time.Hour))},
		{"expired", "machine CA", ca.issue(t, key, now.Add(-2*time.Hour), now.Add(-time.Minute))},
		{"not yet valid", "machine CA", ca.issue(t, key, now.Add(time.Minute), now.Add(time.Hour))},
		{"garbage", "does not parse", []byte("junk")},
	}
	for _, tc := range cases {
		err := checkRenewed(id, key, &agentv1.Renewed{CertificateDer: tc.cert})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
