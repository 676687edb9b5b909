package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
)

// NewKey makes the node's private key and a CSR for it. The key never leaves the node.
func NewKey() (keyDER, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "bcd"}}, key)
	return keyDER, csrDER, err
}

// Join trades a join token for an identity at the control plane at url (its API's base URL)
// and returns it; the caller keeps it in its store. client may be nil.
func Join(ctx context.Context, client *http.Client, url, token string, facts *agentv1.MachineFacts) (Identity, error) {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return Identity{}, fmt.Errorf("join: --url %q must be the control plane's http(s) URL", url)
	}
	keyDER, csrDER, err := NewKey()
	if err != nil {
		return Identity{}, err
	}
	c := agentv1connect.NewJoinServiceClient(client, strings.TrimRight(url, "/"))
	resp, err := c.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{Token: token, CsrDer: csrDER, Facts: facts}))
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable {
			return Identity{}, fmt.Errorf("join: cannot reach the control plane at %s: %s", url, ce.Message())
		}
		if errors.As(err, &ce) {
			return Identity{}, fmt.Errorf("join refused (%s): %s", ce.Code(), ce.Message())
		}
		return Identity{}, fmt.Errorf("join: reach %s: %w", url, err)
	}
	m := resp.Msg
	return Identity{NodeID: m.GetNodeId(), NodeName: m.GetNodeName(), KeyDER: keyDER, CertDER: m.GetCertificateDer(),
		CADER: m.GetCaCertificatesDer(), Gateways: m.GetGatewayAddresses(), NotAfter: m.GetNotAfter().AsTime(), URL: url}, nil
}
