package gateway

import (
	"crypto/x509"
	"net/http"
	"time"
)

// NodeFiles serves h to nodes beside their sessions (the release repository): a request must
// carry a client certificate that the TLS stack verified against the machine CA and that is
// neither revoked nor expired, as a session must, and is refused while the gateway is not
// running (its revocations are not known yet).
func (g *Gateway) NodeFiles(h http.Handler) http.Handler {
	return withNode(func(w http.ResponseWriter, r *http.Request, cert *x509.Certificate) {
		g.mu.Lock()
		running := g.running
		g.mu.Unlock()
		if !running {
			http.Error(w, ErrNotRunning.Error(), http.StatusServiceUnavailable)
			return
		}
		if _, err := g.revoked.CheckNode(cert); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		if !time.Now().Before(cert.NotAfter) {
			http.Error(w, "the node's certificate has expired; join again", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
