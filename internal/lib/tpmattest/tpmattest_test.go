package tpmattest_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/internal/lib/tpmattest"
	"github.com/better-compute/compute/internal/lib/tpmattest/swtpmtest"
)

// sealer is the control plane's SecretBox as compute builds it: AES-256-GCM under a key derived
// from the secret for the purpose, the purpose bound as additional data.
type sealer struct{ secret string }

func (s sealer) Seal(purpose string, plain []byte) ([]byte, error) {
	a, err := pki.SecretCipher(s.secret, purpose)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, a.NonceSize())
	return a.Seal(nonce, nonce, plain, []byte(purpose)), nil
}

func (s sealer) Open(purpose string, sealed []byte) ([]byte, error) {
	a, err := pki.SecretCipher(s.secret, purpose)
	if err != nil {
		return nil, err
	}
	if len(sealed) < a.NonceSize() {
		return nil, errors.New("short")
	}
	return a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], []byte(purpose))
}

var (
	box     = sealer{"a secret of at least thirty-two characters"}
	binding = []byte("the digest of token, CSR and facts")
)

// node opens the swtpm and makes a Node on it, closed when the test ends.
func node(t *testing.T, s *swtpmtest.TPM) *tpmattest.Node {
	t.Helper()
	rw, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	n, err := tpmattest.NewNode(rw)
	if err != nil {
		rw.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("flush: %v", err)
		}
		rw.Close()
	})
	return n
}

// TestAttestWithSWTPM: a real (software) TPM's EK, certificate, AK, activation and quote verify,
// and what Verify establishes is what the TPM holds.
func TestAttestWithSWTPM(t *testing.T) {
	t.Parallel()
	s := swtpmtest.Start(t)
	measured := sha256.Sum256([]byte("a boot loader"))
	s.Extend(t, 4, measured[:])
	want := s.PCRs(t) // before the node holds swtpm's one connection
	n := node(t, s)
	ev := n.Evidence()
	if len(ev.GetEkCertificateDer()) == 0 {
		t.Fatal("the swtpm's EK certificate was not read from NV")
	}
	now := time.Now()
	ch, err := tpmattest.Challenge(box, ev, binding, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.GetNonce()) != 32 || len(ch.GetTicket()) == 0 || !ch.GetExpiresAt().AsTime().Equal(now.Add(tpmattest.TicketLifetime).UTC().Truncate(time.Nanosecond)) {
		t.Fatalf("challenge: nonce %d bytes, ticket %d bytes, expires %v", len(ch.GetNonce()), len(ch.GetTicket()), ch.GetExpiresAt().AsTime())
	}
	answer, err := n.Answer(ch)
	if err != nil {
		t.Fatal(err)
	}
	att, err := tpmattest.Verify(box, answer, binding, now.Add(time.Minute))
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	if diff := cmp.Diff(want, att.PCRs); diff != "" {
		t.Errorf("the attested PCRs differ from the TPM's (-tpm +attested):\n%s", diff)
	}
	if bytes.Equal(att.PCRs[4], make([]byte, 32)) {
		t.Error("PCR 4 was extended, yet attested as zero")
	}
	fp, err := tpmattest.Fingerprint(att.EKCertificate.PublicKey)
	if err != nil || fp != att.EKFingerprint || !strings.HasPrefix(fp, "sha256:") {
		t.Errorf("EK fingerprint %q, the certificate's key's %q (%v)", att.EKFingerprint, fp, err)
	}
	if err := att.CheckRoots(nil, now); err == nil {
		t.Error("an EK certificate chained to no roots at all")
	}
	if err := att.CheckRoots([]*x509.Certificate{s.CA.Cert}, now); err != nil {
		t.Errorf("the EK certificate does not chain to the swtpm's CA: %v", err)
	}
	other := swtpmtest.NewCA(t, "another manufacturer")
	if err := att.CheckRoots([]*x509.Certificate{other.Cert}, now); err == nil || !strings.Contains(err.Error(), "does not chain") {
		t.Errorf("an EK certificate checked against another CA: %v", err)
	}
}

// TestVerifyRefuses: each way an answer can be wrong is refused, with the reason.
func TestVerifyRefuses(t *testing.T) {
	t.Parallel()
	s := swtpmtest.Start(t)
	now := time.Now()
	n := node(t, s)
	ch, err := tpmattest.Challenge(box, n.Evidence(), binding, now)
	if err != nil {
		t.Fatal(err)
	}
	good, err := n.Answer(ch)
	if err != nil {
		t.Fatal(err)
	}
	wrongNonce := proto.Clone(good).(*agentv1.TPMEvidence)
	wrongNonce.Quote, wrongNonce.QuoteSignature, wrongNonce.Pcrs, err = n.Quote([]byte("another nonce"))
	if err != nil {
		t.Fatal(err)
	}
	change := func(f func(ev *agentv1.TPMEvidence)) *agentv1.TPMEvidence {
		ev := proto.Clone(good).(*agentv1.TPMEvidence)
		f(ev)
		return ev
	}
	for _, c := range []struct {
		name    string
		ev      *agentv1.TPMEvidence
		binding []byte
		now     time.Time
		want    string
	}{
		{"a wrong activated secret", change(func(ev *agentv1.TPMEvidence) { ev.ActivatedSecret[0] ^= 1 }), binding, now, "activated secret"},
		{"a quote over another nonce", wrongNonce, binding, now, "quote does not verify"},
		{"another join request", good, []byte("another CSR"), now, "another join request"},
		{"an expired ticket", good, binding, now.Add(tpmattest.TicketLifetime), "expired"},
		{"an altered ticket", change(func(ev *agentv1.TPMEvidence) { ev.Ticket[len(ev.Ticket)-1] ^= 1 }), binding, now, "does not open"},
		{"a PCR value not quoted", change(func(ev *agentv1.TPMEvidence) { ev.Pcrs[0] = bytes.Repeat([]byte{1}, 32) }), binding, now, "quote does not verify"},
		{"no quote", change(func(ev *agentv1.TPMEvidence) { ev.Quote = nil }), binding, now, "quote does not verify"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := tpmattest.Verify(box, c.ev, c.binding, c.now); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("verify: %v, want an error saying %q", err, c.want)
			}
		})
	}
	// Another control plane's secret does not open the ticket.
	if _, err := tpmattest.Verify(sealer{"another secret of thirty-two characters"}, good, binding, now); err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Errorf("verify under another secret: %v", err)
	}
	// The good answer still verifies: none of the above was refused for a reason of its own.
	if _, err := tpmattest.Verify(box, good, binding, now); err != nil {
		t.Fatal(err)
	}
}

// TestQuoteByAnotherKey: a quote signed by another AK of the same TPM, over the right nonce, is
// refused: the AK the credential was activated for must sign it.
func TestQuoteByAnotherKey(t *testing.T) {
	t.Parallel()
	s := swtpmtest.Start(t)
	now := time.Now()
	rw, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	first, err := tpmattest.NewNode(rw)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := tpmattest.Challenge(box, first.Evidence(), binding, now)
	if err != nil {
		t.Fatal(err)
	}
	ev := first.Evidence()
	ev.Ticket = ch.GetTicket()
	if ev.ActivatedSecret, err = first.Activate(ch); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := tpmattest.NewNode(rw)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if bytes.Equal(second.Evidence().GetAkPublic(), ev.GetAkPublic()) {
		t.Fatal("two nodes on one TPM made the same AK")
	}
	if ev.Quote, ev.QuoteSignature, ev.Pcrs, err = second.Quote(ch.GetNonce()); err != nil {
		t.Fatal(err)
	}
	if _, err := tpmattest.Verify(box, ev, binding, now); err == nil || !strings.Contains(err.Error(), "quote does not verify") {
		t.Fatalf("a quote by another AK: %v", err)
	}
	// Naming the other AK instead fails the ticket: the credential was made for the first.
	ev.AkPublic = second.Evidence().GetAkPublic()
	if _, err := tpmattest.Verify(box, ev, binding, now); err == nil || !strings.Contains(err.Error(), "another attestation key") {
		t.Fatalf("a quote by another AK, named: %v", err)
	}
}

// TestOpenRefusesWhatIsNoTPM: --tpm takes a device path or a host:port, nothing else.
func TestOpenRefusesWhatIsNoTPM(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"tpmrm0", "", "localhost"} {
		if _, err := tpmattest.Open(where); err == nil || !strings.Contains(err.Error(), "neither a device path") {
			t.Errorf("Open(%q): %v", where, err)
		}
	}
	if _, err := tpmattest.Open("/nonexistent/tpmrm0"); err == nil {
		t.Error("a missing device opened")
	}
}

// TestParseRoots: a pool's roots are single PEM certificates.
func TestParseRoots(t *testing.T) {
	t.Parallel()
	ca := swtpmtest.NewCA(t, "roots")
	if roots, err := tpmattest.ParseRoots([]string{ca.PEM}); err != nil || len(roots) != 1 || !roots[0].Equal(ca.Cert) {
		t.Fatalf("ParseRoots: %v, %v", roots, err)
	}
	for _, bad := range []string{"", "MIIB", ca.PEM + ca.PEM} {
		if _, err := tpmattest.ParseRoots([]string{ca.PEM, bad}); err == nil || !strings.HasPrefix(err.Error(), "ekRoots[1]") {
			t.Errorf("ParseRoots(%.20q): %v", bad, err)
		}
	}
}
