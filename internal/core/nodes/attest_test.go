package nodes_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/lib/tpmattest"
	"github.com/better-compute/compute/internal/lib/tpmattest/swtpmtest"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// attestPlane is a control plane on a real database, a running swtpm whose EK certificate its
// CA signed, and pools of each policy: "tpm" requires attestation with the swtpm's CA as its only
// EK root, "other" requires it with another CA, "opt" makes it optional (no roots: trust on first
// use) and "off" does not look.
type attestPlane struct {
	*joinPlane
	tpm  *swtpmtest.TPM
	rpc  agentv1connect.JoinServiceClient
	open *exchange // the exchange holding swtpm's one connection, if any
}

// release closes the open exchange's TPM connection: swtpm serves one client at a time.
func (p *attestPlane) release() {
	if p.open != nil {
		p.open.tpm.Close()
		p.open.conn.Close()
		p.open = nil
	}
}

func newAttestPlane(t *testing.T) *attestPlane {
	swtpmtest.Require(t)
	p := &attestPlane{joinPlane: newJoinPlane(t), tpm: swtpmtest.Start(t)}
	p.rpc = agentv1connect.NewJoinServiceClient(http.DefaultClient, p.url)
	other := swtpmtest.NewCA(t, "another TPM maker")
	for name, att := range map[string]api.PoolAttestation{
		"tpm":   {TPM: api.TPMRequired, EKRoots: []string{p.tpm.CA.PEM}},
		"other": {TPM: api.TPMRequired, EKRoots: []string{other.PEM}},
		"opt":   {TPM: api.TPMOptional},
		"off":   {TPM: api.TPMOff},
	} {
		if _, err := p.env.Compute.API.Pools.Create(p.ctx, p.env.RootKey, api.CreatePool{Name: name, Attestation: &att}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func (p *attestPlane) tokenFor(t *testing.T, pool string, uses int) api.JoinToken {
	t.Helper()
	jt, err := p.env.Compute.API.JoinTokens.Create(p.ctx, p.env.RootKey, api.CreateJoinToken{Pool: pool, MaxUses: uses})
	if err != nil {
		t.Fatal(err)
	}
	return jt
}

func (p *attestPlane) opener(s *swtpmtest.TPM) func() (io.ReadWriteCloser, error) { return s.Open }

// joinWith joins through nodeagent, as bcd join --tpm does.
func (p *attestPlane) joinWith(jt api.JoinToken, host string, secret []byte, tpm *swtpmtest.TPM) (nodeagent.Identity, error) {
	p.release()
	o := nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: jt.CAHash, TakeoverSecret: secret,
		Facts: &agentv1.MachineFacts{Hostname: host, MachineId: "m-" + host}}
	if tpm != nil {
		o.TPM = p.opener(tpm)
	}
	return nodeagent.JoinWith(p.ctx, o)
}

// rows counts what a join writes: nodes, certificates, events, takeover secrets, and the uses
// left of all join tokens.
func (p *attestPlane) rows(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for name, q := range map[string]string{
		"nodes": `SELECT count(*) FROM compute.nodes`, "certificates": `SELECT count(*) FROM compute.certificates`,
		"events": `SELECT count(*) FROM compute.events`, "takeover secrets": `SELECT count(*) FROM compute.node_takeover_secrets`,
		"token uses left": `SELECT coalesce(sum(uses_left), 0) FROM compute.join_tokens`,
	} {
		out[name] = p.count(t, q)
	}
	return out
}

// exchange is one attested join driven call by call, for tests to alter what the node sends.
type exchange struct {
	req    *agentv1.JoinRequest
	conn   io.ReadWriteCloser // the connection to the swtpm
	rw     io.ReadWriter
	tpm    *tpmattest.Node
	ch     *agentv1.TPMChallenge
	answer *agentv1.TPMEvidence
}

// begin makes a node key and CSR, opens the swtpm, and makes the first call.
func (p *attestPlane) begin(t *testing.T, jt api.JoinToken, host string) *exchange {
	t.Helper()
	p.release()
	csr := csrWithSecret(t)
	rw, err := p.tpm.Open()
	if err != nil {
		t.Fatal(err)
	}
	n, err := tpmattest.NewNode(rw)
	if err != nil {
		t.Fatal(err)
	}
	x := &exchange{req: &agentv1.JoinRequest{Token: jt.Token, CsrDer: csr, Facts: &agentv1.MachineFacts{Hostname: host, MachineId: "m-" + host},
		Tpm: n.Evidence()}, conn: rw, rw: rw, tpm: n}
	p.open = x
	t.Cleanup(p.release)
	resp, err := p.rpc.Join(p.ctx, connect.NewRequest(x.req))
	if err != nil {
		t.Fatalf("the first call: %v", err)
	}
	if x.ch = resp.Msg.GetTpmChallenge(); x.ch == nil || resp.Msg.GetCertificateDer() != nil {
		t.Fatalf("the first call was answered with %v, want a challenge alone", resp.Msg)
	}
	if x.answer, err = n.Answer(x.ch); err != nil {
		t.Fatal(err)
	}
	return x
}

// csrWithSecret makes a node key's CSR carrying a takeover secret, as bcd's does.
func csrWithSecret(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := asn1.Marshal(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "bcd"},
		ExtraExtensions: []pkix.Extension{{Id: nodes.TakeoverOID, Value: secret}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

// second makes the second call with the answer, changed by change.
func (p *attestPlane) second(x *exchange, change func(req *agentv1.JoinRequest)) (*agentv1.JoinResponse, error) {
	req := proto.Clone(x.req).(*agentv1.JoinRequest)
	req.Tpm = proto.Clone(x.answer).(*agentv1.TPMEvidence)
	if change != nil {
		change(req)
	}
	resp, err := p.rpc.Join(p.ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

type tpmFacts struct {
	EKFingerprint string            `json:"ekFingerprint"`
	Trust         string            `json:"trust"`
	PCRBank       string            `json:"pcrBank"`
	PCRs          map[string]string `json:"pcrs"`
	EKCertificate struct {
		Issuer string `json:"issuer"`
	} `json:"ekCertificate"`
}

func (p *attestPlane) facts(t *testing.T, node string) *tpmFacts {
	t.Helper()
	var raw []byte
	if err := p.env.DB.Pool.QueryRow(p.ctx, `SELECT facts->'tpm' FROM compute.nodes WHERE id = $1`, node).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if raw == nil {
		return nil
	}
	var f tpmFacts
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return &f
}

// TestAttestedJoin: a pool that requires TPM attestation admits the swtpm node; its facts record
// the EK and the PCRs the TPM reports, and node.attested says so. The first call spends and
// writes nothing.
func TestAttestedJoin(t *testing.T) {
	t.Parallel()
	p := newAttestPlane(t)
	boot := sha256.Sum256([]byte("shim and grub"))
	p.tpm.Extend(t, 4, boot[:])
	want := p.tpm.PCRs(t)

	jt := p.tokenFor(t, "tpm", 1)
	before := p.rows(t)
	x := p.begin(t, jt, "tpm-1")
	if diff := cmp.Diff(before, p.rows(t)); diff != "" {
		t.Fatalf("the first call wrote or spent (-before +after):\n%s", diff)
	}
	resp, err := p.second(x, nil)
	if err != nil {
		t.Fatalf("the second call: %v", err)
	}
	if !resp.GetTpmAttested() || resp.GetNodeId() == "" || len(resp.GetCertificateDer()) == 0 {
		t.Fatalf("admitted %q, attested %v, certificate %d bytes", resp.GetNodeId(), resp.GetTpmAttested(), len(resp.GetCertificateDer()))
	}
	f := p.facts(t, resp.GetNodeId())
	if f == nil {
		t.Fatal("no tpm facts")
	}
	ekCert, err := x509.ParseCertificate(x.req.GetTpm().GetEkCertificateDer())
	if err != nil {
		t.Fatal(err)
	}
	fp, err := tpmattest.Fingerprint(ekCert.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if f.EKFingerprint != fp || f.Trust != "ekRoots" || f.PCRBank != "sha256" || f.EKCertificate.Issuer != p.tpm.CA.Cert.Subject.String() {
		t.Errorf("tpm facts %+v; want EK %s trusted by ekRoots, issued by %s", f, fp, p.tpm.CA.Cert.Subject)
	}
	got := make([][]byte, len(f.PCRs))
	for i := range got {
		if got[i], err = hex.DecodeString(f.PCRs[strconv.Itoa(i)]); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the recorded PCRs differ from the TPM's (-tpm +recorded):\n%s", diff)
	}
	var data []byte
	if err := p.env.DB.Pool.QueryRow(p.ctx, `SELECT data FROM compute.events WHERE type = 'node.attested' AND subject = $1`, resp.GetNodeId()).Scan(&data); err != nil {
		t.Fatalf("node.attested: %v", err)
	}
	var ev struct {
		EKFingerprint string   `json:"ekFingerprint"`
		PCRs          []string `json:"pcrs"`
	}
	if err := json.Unmarshal(data, &ev); err != nil || ev.EKFingerprint != fp || len(ev.PCRs) != 8 || ev.PCRs[4] != hex.EncodeToString(want[4]) {
		t.Errorf("node.attested data %s", data)
	}

	// The same through nodeagent, as bcd join --tpm does it.
	id, err := p.joinWith(p.tokenFor(t, "tpm", 1), "tpm-2", nil, p.tpm)
	if err != nil {
		t.Fatalf("nodeagent.JoinWith with the TPM: %v", err)
	}
	if f := p.facts(t, id.NodeID); f == nil || f.EKFingerprint != fp {
		t.Errorf("the nodeagent join's facts: %+v", f)
	}
}

// TestAttestedJoinRefusals: each way an attested join can be wrong is refused with
// permission_denied saying why, and a refused join creates and spends nothing.
func TestAttestedJoinRefusals(t *testing.T) {
	t.Parallel()
	p := newAttestPlane(t)
	_, otherCSR, err := nodeagent.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		pool string
		join func(t *testing.T, jt api.JoinToken) error
		want string
	}{
		{"no TPM proof", "tpm", func(t *testing.T, jt api.JoinToken) error {
			_, err := p.joinWith(jt, "plain", nil, nil)
			return err
		}, "requires TPM attestation"},
		{"an EK certificate from another CA", "other", func(t *testing.T, jt api.JoinToken) error {
			_, err := p.second(p.begin(t, jt, "n"), nil)
			return err
		}, "does not chain to the pool's ekRoots"},
		{"a wrong activated secret", "tpm", func(t *testing.T, jt api.JoinToken) error {
			_, err := p.second(p.begin(t, jt, "n"), func(r *agentv1.JoinRequest) { r.Tpm.ActivatedSecret[0] ^= 1 })
			return err
		}, "the AK is not in the TPM of the EK"},
		{"a quote over another nonce", "tpm", func(t *testing.T, jt api.JoinToken) error {
			x := p.begin(t, jt, "n")
			quote, sig, pcrs, err := x.tpm.Quote([]byte("a nonce of the node's choosing"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.second(x, func(r *agentv1.JoinRequest) { r.Tpm.Quote, r.Tpm.QuoteSignature, r.Tpm.Pcrs = quote, sig, pcrs })
			return err
		}, "the quote does not verify"},
		{"a quote signed by another key", "tpm", func(t *testing.T, jt api.JoinToken) error {
			x := p.begin(t, jt, "n")
			if err := x.tpm.Close(); err != nil { // swtpm has room for three loaded keys
				t.Fatal(err)
			}
			another, err := tpmattest.NewNode(x.rw) // another AK of the same TPM
			if err != nil {
				t.Fatal(err)
			}
			defer another.Close()
			quote, sig, pcrs, err := another.Quote(x.ch.GetNonce())
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.second(x, func(r *agentv1.JoinRequest) { r.Tpm.Quote, r.Tpm.QuoteSignature, r.Tpm.Pcrs = quote, sig, pcrs })
			return err
		}, "the quote does not verify"},
		{"a ticket replayed with another CSR", "tpm", func(t *testing.T, jt api.JoinToken) error {
			_, err := p.second(p.begin(t, jt, "n"), func(r *agentv1.JoinRequest) { r.CsrDer = otherCSR })
			return err
		}, "made for another join request"},
		{"an expired ticket", "tpm", func(t *testing.T, jt api.JoinToken) error {
			x := p.begin(t, jt, "n")
			p.env.DB.SetNow(time.Now().Add(tpmattest.TicketLifetime + time.Minute))
			defer p.env.DB.ResetNow()
			_, err := p.second(x, nil)
			return err
		}, "expired"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			jt := p.tokenFor(t, c.pool, 1)
			before := p.rows(t)
			err := c.join(t, jt)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "permission_denied") {
				t.Fatalf("%v; want permission_denied saying %q", err, c.want)
			}
			if diff := cmp.Diff(before, p.rows(t)); diff != "" {
				t.Errorf("the refused join wrote or spent (-before +after):\n%s", diff)
			}
		})
	}
}

// TestAttestedJoinIsAdmittedOnce: a second Join replayed (same ticket, same CSR) does not admit
// twice: with a one-use token the token is spent; with one of many uses the ticket is, once it
// admitted its node.
func TestAttestedJoinIsAdmittedOnce(t *testing.T) {
	t.Parallel()
	p := newAttestPlane(t)
	x := p.begin(t, p.tokenFor(t, "tpm", 1), "once")
	if _, err := p.second(x, nil); err != nil {
		t.Fatal(err)
	}
	before := p.rows(t)
	if _, err := p.second(x, nil); err == nil || connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("the replay with a spent one-use token: %v, want unauthenticated", err)
	}
	if diff := cmp.Diff(before, p.rows(t)); diff != "" {
		t.Errorf("the refused replay wrote or spent (-before +after):\n%s", diff)
	}

	x = p.begin(t, p.tokenFor(t, "tpm", 5), "many")
	if _, err := p.second(x, nil); err != nil {
		t.Fatal(err)
	}
	before = p.rows(t)
	if _, err := p.second(x, nil); err == nil || !strings.Contains(err.Error(), "already admitted") {
		t.Fatalf("the replay with a token of many uses: %v, want a refusal of the used ticket", err)
	}
	if diff := cmp.Diff(before, p.rows(t)); diff != "" {
		t.Errorf("the refused replay wrote or spent (-before +after):\n%s", diff)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.nodes WHERE name IN ('once', 'many')`); n != 2 {
		t.Errorf("%d nodes, want 2", n)
	}
}

// TestAttestationPolicies: an optional pool admits without a TPM, and with one records it, its EK
// trusted on first use; an off pool admits a node with a TPM unattested, recording nothing.
func TestAttestationPolicies(t *testing.T) {
	t.Parallel()
	p := newAttestPlane(t)
	plain, err := p.joinWith(p.tokenFor(t, "opt", 1), "plain", nil, nil)
	if err != nil {
		t.Fatalf("an optional pool, no TPM: %v", err)
	}
	if f := p.facts(t, plain.NodeID); f != nil {
		t.Errorf("an unattested node has tpm facts %+v", f)
	}
	x := p.begin(t, p.tokenFor(t, "opt", 1), "attested")
	resp, err := p.second(x, nil)
	if err != nil || !resp.GetTpmAttested() {
		t.Fatalf("an optional pool, with a TPM: %v, attested %v", err, resp.GetTpmAttested())
	}
	if f := p.facts(t, resp.GetNodeId()); f == nil || f.Trust != "firstUse" {
		t.Errorf("an optional pool without roots: facts %+v, want the EK trusted on first use", f)
	}
	// An optional pool still refuses a proof that does not verify.
	bad := p.begin(t, p.tokenFor(t, "opt", 1), "bad")
	if _, err := p.second(bad, func(r *agentv1.JoinRequest) { r.Tpm.ActivatedSecret = nil }); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("an optional pool, a bad proof: %v", err)
	}

	x = p.begin(t, p.tokenFor(t, "off", 1), "ignored")
	resp, err = p.second(x, nil)
	if err != nil || resp.GetTpmAttested() {
		t.Fatalf("an off pool, with a TPM: %v, attested %v", err, resp.GetTpmAttested())
	}
	if f := p.facts(t, resp.GetNodeId()); f != nil {
		t.Errorf("an off pool recorded tpm facts %+v", f)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.events WHERE type = 'node.attested'`); n != 1 {
		t.Errorf("%d node.attested events, want 1", n)
	}

	// Through nodeagent, the node is told which: attested (by which EK), or not looked at.
	for _, c := range []struct{ pool, want string }{{"off", "level=WARN msg=\"join: the node joined unattested"}, {"opt", "msg=\"join: attested by the TPM\" ek=sha256:"}} {
		var log bytes.Buffer
		p.release()
		jt := p.tokenFor(t, c.pool, 1)
		id, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: jt.CAHash, TPM: p.tpm.Open,
			Facts: &agentv1.MachineFacts{Hostname: "told-" + c.pool, MachineId: "m"}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil || !strings.Contains(log.String(), c.want) {
			t.Errorf("a join into %s: %v; logged %q, want %q", c.pool, err, log.String(), c.want)
		}
		if f := p.facts(t, id.NodeID); f != nil && !strings.Contains(log.String(), f.EKFingerprint) {
			t.Errorf("logged %q, recorded EK %s", log.String(), f.EKFingerprint)
		}
	}
}

// TestAttestedNodeIsPinnedToItsEK: without ekRoots an EK is trusted on first use and pinned: the
// node's rejoin with its takeover secret must bring the same TPM (not none, not another), while
// an operator's takeover token may bring a new one.
func TestAttestedNodeIsPinnedToItsEK(t *testing.T) {
	t.Parallel()
	p := newAttestPlane(t)
	first, err := p.joinWith(p.tokenFor(t, "opt", 1), "pinned", nil, p.tpm)
	if err != nil {
		t.Fatal(err)
	}
	pinned := p.facts(t, first.NodeID).EKFingerprint
	another := swtpmtest.Start(t)
	for _, c := range []struct {
		name string
		tpm  *swtpmtest.TPM
		want string
	}{
		{"no TPM", nil, "was attested with the TPM of EK " + pinned},
		{"another TPM", another, "and this machine's is"},
	} {
		jt := p.tokenFor(t, "opt", 1)
		before := p.rows(t)
		_, err := p.joinWith(jt, "pinned", first.TakeoverSecret, c.tpm)
		if err == nil || !strings.Contains(err.Error(), "permission_denied") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a rejoin with %s: %v, want permission_denied saying %q", c.name, err, c.want)
		}
		if diff := cmp.Diff(before, p.rows(t)); diff != "" {
			t.Errorf("the refused rejoin with %s wrote or spent (-before +after):\n%s", c.name, diff)
		}
	}
	again, err := p.joinWith(p.tokenFor(t, "opt", 1), "pinned", first.TakeoverSecret, p.tpm)
	if err != nil || again.NodeID != first.NodeID {
		t.Fatalf("a rejoin with the node's TPM: %v", err)
	}
	scoped, err := p.env.Compute.API.JoinTokens.Create(p.ctx, p.env.RootKey, api.CreateJoinToken{Pool: "opt", Node: first.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	replaced, err := p.joinWith(scoped, "pinned", nil, another)
	if err != nil || replaced.NodeID != first.NodeID {
		t.Fatalf("a takeover token with another TPM: %v", err)
	}
	if f := p.facts(t, first.NodeID); f == nil || f.EKFingerprint == pinned {
		t.Errorf("after the takeover the node is pinned to %+v, want the new TPM's EK", f)
	}
}
