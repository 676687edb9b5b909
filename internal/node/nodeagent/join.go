package nodeagent

import (
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/internal/lib/tpmattest"
)

// NewKey makes the node's private key and a CSR for it. The key never leaves the node.
func NewKey() (keyDER, csrDER []byte, err error) { return newKey(nil) }

// takeoverOID must equal nodes.TakeoverOID: the CSR extension carrying the takeover secret.
var takeoverOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 59436, 1, 1}

// newKey is NewKey whose CSR also carries the node's takeover secret, when there is one.
func newKey(takeoverSecret []byte) (keyDER, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "bcd"}}
	if len(takeoverSecret) > 0 {
		v, err := asn1.Marshal(takeoverSecret)
		if err != nil {
			return nil, nil, err
		}
		tmpl.ExtraExtensions = []pkix.Extension{{Id: takeoverOID, Value: v}}
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	return keyDER, csrDER, err
}

// Join trades a join token for an identity at the control plane at url (its API's base URL)
// and returns it; the caller keeps it in its store. client may be nil.
func Join(ctx context.Context, client *http.Client, url, token string, facts *agentv1.MachineFacts) (Identity, error) {
	return JoinWith(ctx, JoinOptions{Client: client, URL: url, Token: token, Facts: facts})
}

// JoinOptions is what JoinWith needs. URL, Token and Facts are required.
type JoinOptions struct {
	Client *http.Client // nil: a client with a 30s timeout
	URL    string       // the control plane's API; http:// only on a loopback address
	Token  string
	// CAHash pins the machine CA (sha256:<hex>, printed with the join token): the CA the
	// server sends is refused unless its public key has this hash. Empty: not checked.
	CAHash string
	// TakeoverSecret is the secret of an earlier join of this node (Identity.TakeoverSecret):
	// it proves that this machine is that node, to take it over again. Empty: a new one is made.
	TakeoverSecret []byte
	Facts          *agentv1.MachineFacts
	// PlainHTTP allows a plain http URL to any host, when CAHash pins the CA (so that nobody on
	// the path can answer with their own): for a one-use credential that reached the machine in
	// the clear anyway, as a deploy's does on its provisioning network.
	PlainHTTP bool
	// TPM, when set, opens the machine's TPM (tpmattest.Open: /dev/tpmrm0, or swtpm's host:port)
	// to attest the join with, in two calls: its EK and a new AK go with the first, and the TPM
	// answers the challenge that comes back in the second. nil: the join is not attested.
	TPM func() (io.ReadWriteCloser, error)
	// Logger is told what does not stop a join, such as a pool that took no TPM evidence; nil:
	// slog.Default().
	Logger *slog.Logger
}

// JoinWith is Join with the CA pinned and, for a node joining again, its takeover secret.
func JoinWith(ctx context.Context, o JoinOptions) (Identity, error) {
	client, url := o.Client, o.URL
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	if err := checkJoinURL(url, o.PlainHTTP && o.CAHash != ""); err != nil {
		return Identity{}, err
	}
	var pin []byte
	if o.CAHash != "" {
		var err error
		if pin, err = parseCAHash(o.CAHash); err != nil {
			return Identity{}, err
		}
	}
	secret := o.TakeoverSecret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return Identity{}, err
		}
	}
	keyDER, csrDER, err := newKey(secret)
	if err != nil {
		return Identity{}, err
	}
	c := agentv1connect.NewJoinServiceClient(client, strings.TrimRight(url, "/"))
	req := &agentv1.JoinRequest{Token: o.Token, CsrDer: csrDER, Facts: o.Facts}
	var m *agentv1.JoinResponse
	var ek string // the TPM's EK fingerprint
	if o.TPM != nil {
		m, ek, err = joinAttested(ctx, c, url, req, o.TPM)
	} else {
		m, err = callJoin(ctx, c, url, req)
	}
	if err != nil {
		return Identity{}, err
	}
	log := cmp.Or(o.Logger, slog.Default())
	switch {
	case o.TPM != nil && m.GetTpmAttested():
		log.Info("join: attested by the TPM", "ek", ek)
	case o.TPM != nil:
		log.Warn("join: the node joined unattested: its pool takes no TPM evidence (attestation policy off)")
	}
	id := Identity{NodeID: m.GetNodeId(), NodeName: m.GetNodeName(), KeyDER: keyDER, CertDER: m.GetCertificateDer(),
		CADER: m.GetCaCertificatesDer(), Gateways: m.GetGatewayAddresses(), NotAfter: m.GetNotAfter().AsTime(), URL: url,
		TakeoverSecret: secret}
	if err := checkJoined(id, pin); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// callJoin calls JoinService.Join, and says what a failure means.
func callJoin(ctx context.Context, c agentv1connect.JoinServiceClient, url string, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	resp, err := c.Join(ctx, connect.NewRequest(req))
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeUnavailable {
			return nil, fmt.Errorf("join: cannot reach the control plane at %s: %s", url, ce.Message())
		}
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("join refused (%s): %s", ce.Code(), ce.Message())
		}
		return nil, fmt.Errorf("join: reach %s: %w", url, err)
	}
	return resp.Msg, nil
}

// joinAttested is an attested join's two calls: the TPM's keys, then its answer to the challenge.
func joinAttested(ctx context.Context, c agentv1connect.JoinServiceClient, url string, req *agentv1.JoinRequest,
	open func() (io.ReadWriteCloser, error)) (*agentv1.JoinResponse, string, error) {
	rw, err := open()
	if err != nil {
		return nil, "", fmt.Errorf("join: %w", err)
	}
	defer rw.Close()
	tpm, err := tpmattest.NewNode(rw)
	if err != nil {
		return nil, "", fmt.Errorf("join: %w", err)
	}
	defer tpm.Close()
	ek, err := tpm.EKFingerprint()
	if err != nil {
		return nil, "", fmt.Errorf("join: %w", err)
	}
	req.Tpm = tpm.Evidence()
	first, err := callJoin(ctx, c, url, req)
	if err != nil {
		return nil, "", err
	}
	ch := first.GetTpmChallenge()
	if ch == nil {
		return first, ek, nil // a control plane that predates attested joins admitted it at once
	}
	if req.Tpm, err = tpm.Answer(ch); err != nil {
		return nil, "", fmt.Errorf("join: answer the control plane's TPM challenge: %w", err)
	}
	m, err := callJoin(ctx, c, url, req)
	return m, ek, err
}

// checkJoinURL refuses what is not http(s), and plain http anywhere but loopback (unless
// plainOK): over it the token travels in the clear and anyone on the path could answer with
// their own CA.
func checkJoinURL(raw string, plainOK bool) error {
	u, err := neturl.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("join: --url %q must be the control plane's http(s) URL", raw)
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) && !plainOK {
		return fmt.Errorf("join: --url %q is plain http to a host that is not loopback; use https:// (plain http is only for 127.0.0.1, ::1 or localhost)", raw)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func parseCAHash(s string) ([]byte, error) {
	h, ok := strings.CutPrefix(s, "sha256:")
	b, err := hex.DecodeString(h)
	if !ok || err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("join: --ca-hash %q must be sha256: and 64 hex digits, as printed with the join token", s)
	}
	return b, nil
}

// checkJoined verifies what the server sent before anything is kept: the CA matches the pin,
// and the certificate is for our key and chains to that CA.
func checkJoined(id Identity, pin []byte) error {
	if len(id.CADER) == 0 {
		return errors.New("join: the server sent no CA certificate")
	}
	ca, err := x509.ParseCertificate(id.CADER[0])
	if err != nil {
		return fmt.Errorf("join: the server's CA certificate does not parse: %w", err)
	}
	if pin != nil {
		got := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
		if subtle.ConstantTimeCompare(got[:], pin) != 1 {
			return fmt.Errorf("join: the server's CA (sha256:%x) does not match --ca-hash; refusing to trust it", got)
		}
	}
	return CheckCertificate(id.KeyDER, id.CertDER, id.CADER, time.Now())
}

// CheckCertificate verifies that certDER is for the private key keyDER, chains to one of the CA
// certificates caDER and is valid at now. The agent checks every certificate it is given with it.
func CheckCertificate(keyDER, certDER []byte, caDER [][]byte, now time.Time) error {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return fmt.Errorf("the certificate does not parse: %w", err)
	}
	key, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return fmt.Errorf("the node key does not parse: %w", err)
	}
	signer, ok := key.(interface{ Public() crypto.PublicKey })
	pub, isEq := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !isEq || !pub.Equal(signer.Public()) {
		return errors.New("the certificate is not for this node's key")
	}
	roots := x509.NewCertPool()
	for _, der := range caDER {
		ca, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("a CA certificate does not parse: %w", err)
		}
		roots.AddCert(ca)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("the certificate does not verify against the machine CA: %w", err)
	}
	return nil
}
