// Package pki is the machine PKI: a CA whose private key is stored encrypted with a key derived
// from the control plane's secret, short-lived node client certificates issued from CSRs, the
// gateway's server certificates (rotated before they expire), and revocation, which gateways
// hold in memory (Revocations) and learn of by NOTIFY.
package pki

import (
	"context"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"embed"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the PKI's schema.
var Migrations = postgres.EmbeddedMigrations("pki", "compute", migrationsFS)

// Defaults.
const (
	DefaultNodeLifetime    = 24 * time.Hour
	DefaultGatewayLifetime = 30 * 24 * time.Hour
	caLifetime             = 10 * 365 * 24 * time.Hour
)

// nodeURIPrefix names nodes in their certificates' URI SAN: spiffe://better-compute/node/<id>.
const nodeURIPrefix = "spiffe://better-compute/node/"

// ErrRevoked is wrapped by the error of a handshake with a revoked or unknown certificate.
var ErrRevoked = errors.New("pki: certificate revoked")

// Authority is the machine CA.
type Authority struct {
	db   *postgres.DB
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

// Load returns the machine CA of db, creating it on first use. Several processes may call it at
// once: one CA is kept, the others' are discarded.
func Load(ctx context.Context, db *postgres.DB, secret string) (*Authority, error) {
	aead, err := keyCipher(secret)
	if err != nil {
		return nil, err
	}
	var certDER, sealed []byte
	err = db.Pool.QueryRow(ctx, `SELECT certificate, encrypted_key FROM compute.pki_authority WHERE id = 1`).Scan(&certDER, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		certDER, sealed, err = newAuthority(aead)
		if err != nil {
			return nil, err
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO compute.pki_authority (id, certificate, encrypted_key) VALUES (1, $1, $2)
			ON CONFLICT (id) DO NOTHING`, certDER, sealed); err != nil {
			return nil, fmt.Errorf("pki: store the CA: %w", err)
		}
		err = db.Pool.QueryRow(ctx, `SELECT certificate, encrypted_key FROM compute.pki_authority WHERE id = 1`).Scan(&certDER, &sealed)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: read the CA: %w", err)
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("pki: the stored CA certificate does not parse: %w", err)
	}
	if len(sealed) < aead.NonceSize() {
		return nil, errors.New("pki: the stored CA key is truncated")
	}
	der, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], certDER)
	if err != nil {
		return nil, errors.New("pki: the machine CA's key does not decrypt with Options.Secret: is this the secret the CA was created with?")
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("pki: the CA key: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &Authority{db: db, cert: cert, key: k.(crypto.Signer), pool: pool}, nil
}

// keyCipher derives the AEAD that seals the CA key from the secret.
func keyCipher(secret string) (cipher.AEAD, error) {
	return SecretCipher(secret, "better-compute machine CA key")
}

// SecretCipher derives an AES-256-GCM AEAD from the deployment's secret for one purpose (HKDF's
// info): each purpose gets its own key.
func SecretCipher(secret, purpose string) (cipher.AEAD, error) {
	if secret == "" {
		return nil, errors.New("pki: no secret")
	}
	key, err := hkdf.Key(sha256.New, []byte(secret), nil, purpose, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func newAuthority(aead cipher.AEAD) (certDER, sealed []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Better Compute machine CA", Organization: []string{"Better Compute"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	certDER, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	// The certificate is the additional data: a key cannot be paired with another CA's certificate.
	return certDER, append(nonce, aead.Seal(nil, nonce, der, certDER)...), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// Certificate is the CA's certificate.
func (a *Authority) Certificate() *x509.Certificate { return a.cert }

// Pool is a pool holding only the CA, for verifying peers.
func (a *Authority) Pool() *x509.CertPool { return a.pool }

// IssueNode signs a client certificate for node nodeID of role (api.RoleNode, api.RoleSite: its
// organizational unit, checked at every session) from a CSR, valid for lifetime, and records it.
// The key stays with the node: only its public half is in the CSR.
func (a *Authority) IssueNode(ctx context.Context, q postgres.Querier, nodeID, role string, csrDER []byte, lifetime time.Duration) (certDER []byte, notAfter time.Time, err error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: the CSR does not parse: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: the CSR's signature does not verify: %w", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, time.Time{}, errors.New("pki: the CSR's ECDSA key must be on P-256 or P-384")
		}
	case ed25519.PublicKey:
	default:
		return nil, time.Time{}, fmt.Errorf("pki: the CSR's key is a %T; use ECDSA P-256 or Ed25519", csr.PublicKey)
	}
	if lifetime <= 0 {
		lifetime = DefaultNodeLifetime
	}
	uri, _ := url.Parse(nodeURIPrefix + nodeID)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "node/" + nodeID, Organization: []string{"Better Compute"}, OrganizationalUnit: []string{role}},
		URIs:         []*url.URL{uri},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return a.sign(ctx, q, tmpl, csr.PublicKey, "node", nodeID)
}

func (a *Authority) sign(ctx context.Context, q postgres.Querier, tmpl *x509.Certificate, pub any, kind, subject string) ([]byte, time.Time, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, pub, a.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: sign: %w", err)
	}
	if _, err := q.Exec(ctx, `INSERT INTO compute.certificates (serial, kind, subject, not_after) VALUES ($1, $2, $3, $4)`,
		tmpl.SerialNumber.Text(16), kind, subject, tmpl.NotAfter); err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: record certificate: %w", err)
	}
	return der, tmpl.NotAfter, nil
}

// IssueGateway makes a server certificate (and its key) for a gateway that answers as hosts
// (DNS names or IP addresses), valid for DefaultGatewayLifetime.
func (a *Authority) IssueGateway(ctx context.Context, name string, hosts []string) (tls.Certificate, error) {
	return a.IssueGatewayFor(ctx, name, hosts, DefaultGatewayLifetime)
}

// IssueGatewayFor is IssueGateway with a lifetime.
func (a *Authority) IssueGatewayFor(ctx context.Context, name string, hosts []string, lifetime time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "gateway/" + name, Organization: []string{"Better Compute"}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, _, err := a.sign(ctx, a.db.Pool, tmpl, &key.PublicKey, "gateway", name)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der, a.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// NodeID returns the node a certificate names.
func NodeID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if id, ok := strings.CutPrefix(u.String(), nodeURIPrefix); ok && id != "" {
			return id, nil
		}
	}
	return "", errors.New("pki: the certificate names no node")
}

// Role returns the role a node's certificate was issued for: its organizational unit, or
// "node" for a certificate issued before roles.
func Role(cert *x509.Certificate) string {
	if ou := cert.Subject.OrganizationalUnit; len(ou) == 1 && ou[0] != "" {
		return ou[0]
	}
	return "node"
}

// Check verifies, for a peer whose chain the TLS stack has already verified against the CA,
// that its certificate is a node's, recorded and not revoked. It returns the node's id. It asks
// the database: the gateway checks handshakes against a Revocations set in memory instead.
func (a *Authority) Check(ctx context.Context, cert *x509.Certificate) (string, error) {
	id, err := NodeID(cert)
	if err != nil {
		return "", err
	}
	var revoked bool
	err = a.db.Pool.QueryRow(ctx, `SELECT revoked_at IS NOT NULL FROM compute.certificates WHERE serial = $1 AND kind = 'node' AND subject = $2`,
		cert.SerialNumber.Text(16), id).Scan(&revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: certificate %s of node %s was not issued here", ErrRevoked, cert.SerialNumber.Text(16), id)
	}
	if err != nil {
		return "", fmt.Errorf("pki: check certificate: %w", err)
	}
	if revoked {
		return "", fmt.Errorf("%w: certificate %s of node %s", ErrRevoked, cert.SerialNumber.Text(16), id)
	}
	return id, nil
}

// RevokeNode revokes every certificate of a node and announces it on RevocationsChannel (on
// commit), so that gateways refuse its next session and end the one it has open.
func RevokeNode(ctx context.Context, q postgres.Querier, nodeID string) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE compute.certificates SET revoked_at = compute.compute_now()
		WHERE kind = 'node' AND subject = $1 AND revoked_at IS NULL`, nodeID)
	if err != nil {
		return 0, err
	}
	if _, err := q.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, RevocationsChannel, nodeID); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// ServerTLS is the gateway's TLS configuration: TLS 1.3 and a client certificate from the
// machine CA required. The server certificate is cert until two thirds of its life have passed,
// then a new one for the same gateway and hosts, and so on (see Rotating). Revocation is not
// checked here: a refused handshake is indistinguishable, for a node, from a network fault, so
// the gateway refuses revoked certificates explicitly, from a Revocations set in memory.
func (a *Authority) ServerTLS(cert tls.Certificate) *tls.Config {
	r := a.Rotating(cert)
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: r.GetCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      a.pool,
		NextProtos:     []string{"h2"},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("pki: no client certificate")
			}
			return nil
		},
	}
}
