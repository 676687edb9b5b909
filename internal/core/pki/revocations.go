package pki

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// RevocationsChannel announces that a node's certificates were revoked: the payload is its id.
const RevocationsChannel = "compute_revocations"

// Revocations is the set of revoked node certificates that have not expired yet, held in memory
// so that a reconnect storm costs no query per handshake. Its owner loads it at start, reloads a
// node on each RevocationsChannel notification, and reloads it all now and then (and after its
// listening connection came back), in case a notification was lost.
type Revocations struct {
	mu      sync.RWMutex
	loaded  bool
	serials map[string]string // serial -> node id
}

// NewRevocations returns an empty set, not yet loaded: until Load, Revoked refuses nothing and
// Loaded is false.
func NewRevocations() *Revocations { return &Revocations{serials: map[string]string{}} }

// Load replaces the set with every revoked node certificate still within its life.
func (r *Revocations) Load(ctx context.Context, q postgres.Querier) error {
	set, err := revoked(ctx, q, `SELECT serial, subject FROM compute.certificates
		WHERE kind = 'node' AND revoked_at IS NOT NULL AND not_after > now()`)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.serials, r.loaded = set, true
	r.mu.Unlock()
	return nil
}

// LoadNode adds the revoked certificates of one node.
func (r *Revocations) LoadNode(ctx context.Context, q postgres.Querier, nodeID string) error {
	set, err := revoked(ctx, q, `SELECT serial, subject FROM compute.certificates
		WHERE kind = 'node' AND subject = $1 AND revoked_at IS NOT NULL AND not_after > now()`, nodeID)
	if err != nil {
		return err
	}
	r.mu.Lock()
	for s, n := range set {
		r.serials[s] = n
	}
	r.mu.Unlock()
	return nil
}

func revoked(ctx context.Context, q postgres.Querier, sql string, args ...any) (map[string]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("pki: load revocations: %w", err)
	}
	set := map[string]string{}
	var serial, node string
	if _, err := pgx.ForEachRow(rows, []any{&serial, &node}, func() error {
		set[serial] = node
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pki: load revocations: %w", err)
	}
	return set, nil
}

// Loaded reports whether the set has been loaded once.
func (r *Revocations) Loaded() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.loaded
}

// Revoked reports whether the certificate with this serial (hex, as Serial gives) is revoked.
func (r *Revocations) Revoked(serial string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.serials[serial]
	return ok
}

// Len is the number of revoked certificates held.
func (r *Revocations) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.serials)
}

// Serial is how certificates are named in the certificates table and in Revocations.
func Serial(cert *x509.Certificate) string { return cert.SerialNumber.Text(16) }

// CheckNode is the in-memory counterpart of Authority.Check: it names the node a certificate
// (whose chain TLS verified) was issued to, unless it is revoked.
func (r *Revocations) CheckNode(cert *x509.Certificate) (string, error) {
	id, err := NodeID(cert)
	if err != nil {
		return "", err
	}
	if r.Revoked(Serial(cert)) {
		return "", fmt.Errorf("%w: certificate %s of node %s", ErrRevoked, Serial(cert), id)
	}
	return id, nil
}
