package tpmattest

import (
	"crypto"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"time"
)

// sanOID is subjectAltName's. An EK certificate's subject is usually empty and its
// subjectAltName, then critical, holds the TPM's manufacturer, model and version as a directory
// name (TCG EK Credential Profile 3.2.9), which crypto/x509 does not read and so leaves as an
// unhandled critical extension.
var sanOID = asn1.ObjectIdentifier{2, 5, 29, 17}

// parseEKCert parses an EK certificate, reading a critical subjectAltName of directory names only
// as handled (anything else in it still fails verification).
func parseEKCert(der []byte) (*x509.Certificate, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: tpm.ek_certificate_der does not parse: %v", ErrInvalid, err)
	}
	i := slices.IndexFunc(cert.UnhandledCriticalExtensions, sanOID.Equal)
	if i < 0 {
		return cert, nil
	}
	for _, e := range cert.Extensions {
		if e.Id.Equal(sanOID) && onlyDirectoryNames(e.Value) {
			cert.UnhandledCriticalExtensions = slices.Delete(slices.Clone(cert.UnhandledCriticalExtensions), i, i+1)
			break
		}
	}
	return cert, nil
}

func onlyDirectoryNames(san []byte) bool {
	var names []asn1.RawValue
	if rest, err := asn1.Unmarshal(san, &names); err != nil || len(rest) != 0 || len(names) == 0 {
		return false
	}
	for _, n := range names {
		if n.Class != asn1.ClassContextSpecific || n.Tag != 4 { // directoryName [4]
			return false
		}
	}
	return true
}

// certFor checks that the EK certificate der is for the EK whose TPMT_PUBLIC is ekPublic.
func certFor(der, ekPublic []byte) error {
	cert, err := parseEKCert(der)
	if err != nil {
		return err
	}
	_, key, err := parsePublic("ek_public", ekPublic)
	if err != nil {
		return err
	}
	if k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(key) {
		return fmt.Errorf("%w: tpm.ek_certificate_der is not a certificate of tpm.ek_public's key", ErrInvalid)
	}
	return nil
}

// ParseRoots parses a pool's EK roots, PEM certificates.
func ParseRoots(pems []string) ([]*x509.Certificate, error) {
	var roots []*x509.Certificate
	for i, p := range pems {
		block, rest := pem.Decode([]byte(p))
		if block == nil || block.Type != "CERTIFICATE" || len(rest) > 0 && pemHasMore(rest) {
			return nil, fmt.Errorf("ekRoots[%d]: must be one PEM CERTIFICATE", i)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("ekRoots[%d]: %w", i, err)
		}
		roots = append(roots, c)
	}
	return roots, nil
}

func pemHasMore(rest []byte) bool {
	b, _ := pem.Decode(rest)
	return b != nil
}

// CheckRoots refuses an attestation whose EK certificate is missing or does not chain, at now,
// to one of roots (each a trust anchor: a TPM manufacturer's root CA, or an intermediate CA to
// trust only what it issued).
func (a *Attestation) CheckRoots(roots []*x509.Certificate, now time.Time) error {
	if a.EKCertificate == nil {
		return errors.New("the TPM has no EK certificate, and the pool trusts only EKs certified by its ekRoots")
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	_, err := a.EKCertificate.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return fmt.Errorf("the EK certificate (issued by %q) does not chain to the pool's ekRoots: %w", a.EKCertificate.Issuer.String(), err)
	}
	return nil
}
