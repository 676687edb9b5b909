package pki

import (
	"context"
	"crypto/tls"
	"strings"
	"sync"
	"time"
)

// issuedEarly is how far before its issue a certificate's NotBefore lies (clock skew).
const issuedEarly = 5 * time.Minute

// retryRotation is how long a failed reissue waits before the next handshake tries again.
const retryRotation = time.Minute

// Rotating serves a gateway's server certificate and reissues it, for the same name and hosts
// and with the same lifetime, once two thirds of its life have passed: a gateway that runs for
// longer than a certificate's life keeps a valid one. A failed reissue keeps the current
// certificate and is tried again a minute later.
type Rotating struct {
	a        *Authority
	name     string
	hosts    []string
	lifetime time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
	retryAt time.Time
}

// Rotating returns a rotating source of server certificates that starts with cert, one that
// IssueGateway or IssueGatewayFor made.
func (a *Authority) Rotating(cert tls.Certificate) *Rotating {
	r := &Rotating{a: a}
	r.set(&cert)
	if leaf := cert.Leaf; leaf != nil {
		r.name = strings.TrimPrefix(leaf.Subject.CommonName, "gateway/")
		r.hosts = append(r.hosts, leaf.DNSNames...)
		for _, ip := range leaf.IPAddresses {
			r.hosts = append(r.hosts, ip.String())
		}
		r.lifetime = leaf.NotAfter.Sub(leaf.NotBefore.Add(issuedEarly))
	}
	return r
}

func (r *Rotating) set(cert *tls.Certificate) {
	r.cert = cert
	if leaf := cert.Leaf; leaf != nil {
		issued := leaf.NotBefore.Add(issuedEarly)
		r.renewAt = issued.Add(leaf.NotAfter.Sub(issued) * 2 / 3)
	}
}

// GetCertificate implements tls.Config.GetCertificate.
func (r *Rotating) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.renewAt.IsZero() || r.lifetime <= 0 || now.Before(r.renewAt) || now.Before(r.retryAt) {
		return r.cert, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := r.a.IssueGatewayFor(ctx, r.name, r.hosts, r.lifetime)
	if err != nil {
		// The current certificate is still valid for a third of its life.
		r.retryAt = now.Add(retryRotation)
		return r.cert, nil
	}
	r.set(&next)
	return r.cert, nil
}
