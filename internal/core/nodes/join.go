package nodes

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/modules"
)

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)

// Join admits a machine: the join token is spent (one use), the node is created in the token's
// pool (or, for the same machine joining again under the same name, taken over), and a client
// certificate is issued for the CSR's key. A refused join creates nothing and spends nothing.
//
// A join with TPM evidence takes two calls: the first (keys, no ticket) is answered with a
// challenge alone, spending and writing nothing; the second (the ticket and the proof) is
// verified under the pool's attestation policy inside the join's transaction (attest.go).
func (m *Module) Join(ctx context.Context, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	rt, err := m.Runtime()
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	auth, _ := m.Authority()
	if req.GetToken() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("token: is required"))
	}
	csr, err := x509.ParseCertificateRequest(req.GetCsrDer())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("csr_der: not a DER certificate request: %w", err))
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("csr_der: its signature does not verify: %w", err))
	}
	name, err := checkFacts(req.GetFacts())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	facts := req.GetFacts()
	secret, err := TakeoverSecret(csr)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if _, ok := m.reg.JoinCredentialFor(req.GetToken()); !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("not a join credential (they start with %s)", strings.Join(m.reg.JoinPrefixes(), " or ")))
	}
	binding := joinBinding(req)
	if ev := req.GetTpm(); ev != nil && len(ev.GetTicket()) == 0 {
		// The first of an attested join's two round trips: a challenge, nothing spent or written.
		resp, err := m.challenge(ctx, rt, ev, binding)
		var ce *connect.Error
		if err != nil && !errors.As(err, &ce) {
			rt.Logger.ErrorContext(ctx, "nodes: TPM challenge failed", "error", err)
			return nil, connect.NewError(connect.CodeInternal, errors.New("join failed; the server log has the detail"))
		}
		return resp, err
	}
	var resp *agentv1.JoinResponse
	err = rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		cred, _ := m.reg.JoinCredentialFor(req.GetToken())
		adm, err := cred.Spend(ctx, tx, req.GetToken())
		if refused := (*modules.JoinRefused)(nil); errors.As(err, &refused) {
			return connect.NewError(connect.CodeUnauthenticated, errors.New(refused.Reason))
		}
		if err != nil {
			return err
		}
		pool, tenant := adm.PoolID, adm.TenantID
		var scoped *string
		if adm.NodeID != "" {
			scoped = &adm.NodeID
		}
		role := cmp.Or(adm.Role, api.RoleNode)
		// The pool's attestation policy, applied after the spend: a refusal rolls the spend back.
		checked, att, err := attest(ctx, tx, rt, pool, req.GetTpm(), binding)
		if err != nil {
			return err
		}
		nodeID, err := admit(ctx, tx, claim{pool: pool, name: name, role: role, facts: facts, secret: secret, scoped: scoped,
			tpmChecked: checked, att: att})
		if err != nil {
			return err
		}
		der, notAfter, err := auth.IssueNode(ctx, tx, nodeID, role, req.GetCsrDer(), m.cfg.CertLifetime)
		if err != nil {
			return connect.NewError(connect.CodeInvalidArgument, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO compute.node_desired (node_id) VALUES ($1) ON CONFLICT DO NOTHING`, nodeID); err != nil {
			return err
		}
		if err := events.Emit(ctx, tx, "node.joined", tenant, nodeID, map[string]any{"pool": pool, "name": name, "role": role}); err != nil {
			return err
		}
		if att != nil {
			if err := events.Emit(ctx, tx, "node.attested", tenant, nodeID, att.event(pool, name)); err != nil {
				return err
			}
		}
		resp = &agentv1.JoinResponse{
			NodeId: nodeID, NodeName: name, CertificateDer: der,
			CaCertificatesDer: [][]byte{auth.Certificate().Raw},
			NotAfter:          timestamppb.New(notAfter), GatewayAddresses: m.cfg.GatewayAddresses,
			TpmAttested: att != nil,
		}
		return nil
	})
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		rt.Logger.ErrorContext(ctx, "nodes: join failed", "error", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("join failed; the server log has the detail"))
	}
	return resp, nil
}

// MaxFactLength bounds each machine fact: they are stored and shown, never trusted.
const MaxFactLength = 256

// checkFacts validates what a joining machine says about itself and returns the node name.
func checkFacts(f *agentv1.MachineFacts) (string, error) {
	name := strings.ToLower(f.GetHostname())
	if !nodeNameRE.MatchString(name) {
		return "", fmt.Errorf("facts.hostname: %q is not a usable node name (letters, digits and '._-')", f.GetHostname())
	}
	for field, v := range map[string]string{"facts.machine_id": f.GetMachineId(), "facts.os": f.GetOs(), "facts.kernel": f.GetKernel(),
		"facts.arch": f.GetArch(), "facts.agent_version": f.GetAgentVersion()} {
		if len(v) > MaxFactLength {
			return "", fmt.Errorf("%s: longer than %d bytes", field, MaxFactLength)
		}
		if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
			return "", fmt.Errorf("%s: must be printable UTF-8 text", field)
		}
	}
	return name, nil
}

// TakeoverOID names the CSR extension in which a node sends its takeover secret (the bytes it
// keeps in its journal). It must equal the one internal/node/nodeagent writes. A CSR is the carrier
// because its signature binds the secret to the key being certified.
var TakeoverOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 59436, 1, 1}

// Takeover secrets are this long; a shorter one is refused rather than hashed.
const takeoverSecretLen = 32

// TakeoverSecret returns the takeover secret a CSR carries, or nil when it carries none.
func TakeoverSecret(csr *x509.CertificateRequest) ([]byte, error) {
	for _, e := range csr.Extensions {
		if !e.Id.Equal(TakeoverOID) {
			continue
		}
		var secret []byte
		if rest, err := asn1.Unmarshal(e.Value, &secret); err != nil || len(rest) != 0 || len(secret) != takeoverSecretLen {
			return nil, fmt.Errorf("csr_der: the takeover secret extension must be an OCTET STRING of %d bytes", takeoverSecretLen)
		}
		return secret, nil
	}
	return nil, nil
}

// claim is what a join asks for: a name in a pool, with what it can prove.
type claim struct {
	pool, name string
	role       string
	facts      *agentv1.MachineFacts
	secret     []byte       // the takeover secret from the CSR, if any
	scoped     *string      // the node a takeover token was issued for, if it was
	tpmChecked bool         // the pool's attestation policy is not off
	att        *attestation // what the join's TPM evidence established, if it was looked at
}

// ErrTakeoverProof is why a join under an existing node's name is refused without proof.
var ErrTakeoverProof = errors.New("takeover needs proof")

// admit creates the node, or takes over the node of the same name when the joiner proves it may:
// it sends the takeover secret the node was given at its first join (kept in bcd's journal), or
// it holds a join token an operator issued for that node. A name and a machine id are not proof:
// anyone can read them. The old node's certificates are revoked.
func admit(ctx context.Context, tx pgx.Tx, c claim) (string, error) {
	var id, state, role, machine, pinnedEK, usedNonce string
	var stored []byte
	err := tx.QueryRow(ctx, `SELECT n.id::text, n.state, n.role, coalesce(n.facts->>'machineId', ''), s.secret_hash,
		coalesce(n.facts->'tpm'->>'ekFingerprint', ''), coalesce(n.facts->'tpm'->>'nonce', '') FROM compute.nodes n
		LEFT JOIN compute.node_takeover_secrets s ON s.node_id = n.id
		WHERE n.pool_id = $1 AND n.name = $2 FOR UPDATE OF n`, c.pool, c.name).Scan(&id, &state, &role, &machine, &stored, &pinnedEK, &usedNonce)
	f := c.facts
	factMap := map[string]any{"hostname": f.GetHostname(), "machineId": f.GetMachineId(), "os": f.GetOs(),
		"kernel": f.GetKernel(), "arch": f.GetArch(), "agentVersion": f.GetAgentVersion()}
	if c.att != nil {
		factMap["tpm"] = c.att.facts() // server-written: the node's own facts never carry this key
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if c.scoped != nil {
			return "", connect.NewError(connect.CodePermissionDenied, fmt.Errorf("this join token only takes over node %s; the pool has no node named %q", *c.scoped, c.name))
		}
		n, err := fleet.InsertNode(ctx, tx, fleet.NewNode{PoolID: c.pool, Name: c.name, Role: c.role, Facts: factMap})
		if err != nil {
			return "", err
		}
		return n.ID, setTakeoverSecret(ctx, tx, n.ID, c.secret)
	case err != nil:
		return "", err
	case role != c.role:
		// A site token does not make a node a site agent, nor a join token a site agent a node.
		return "", connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("the pool has a %s named %q, and this token admits a %s; give this machine another hostname", role, c.name, c.role))
	case state == "retired":
		return "", connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("the pool has a retired node named %q; give this machine another hostname", c.name))
	case c.scoped == nil && (machine == "" || machine != f.GetMachineId()):
		// Another machine: a name clash, not a takeover (a takeover token may still move the name).
		return "", connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("the pool already has a node named %q (another machine); give this machine another hostname", c.name))
	case c.scoped != nil && *c.scoped != id:
		return "", connect.NewError(connect.CodePermissionDenied, fmt.Errorf("this join token only takes over node %s, not %s (%s)", *c.scoped, c.name, id))
	case c.scoped == nil && !secretMatches(stored, c.secret):
		return "", connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
			"%w: the pool already has a node named %q (%s). If this machine is that node, join with the journal it joined with "+
				"(bcd join --rejoin) or with a takeover token for it (joinTokens create --node %s); otherwise give this machine another hostname",
			ErrTakeoverProof, c.name, id, id))
	}
	if err := checkPinned(c, id, c.name, pinnedEK, usedNonce); err != nil {
		return "", err
	}
	if _, err := pki.RevokeNode(ctx, tx, id); err != nil {
		return "", err
	}
	if err := fleet.SetFacts(ctx, tx, []string{id}, factMap); err != nil {
		return "", err
	}
	// A takeover token spends the old secret: only the new joiner's holds from now on.
	if _, err := tx.Exec(ctx, `DELETE FROM compute.node_takeover_secrets WHERE node_id = $1`, id); err != nil {
		return "", err
	}
	return id, setTakeoverSecret(ctx, tx, id, c.secret)
}

func secretMatches(stored, secret []byte) bool {
	if len(stored) == 0 || len(secret) == 0 {
		return false
	}
	h := sha256.Sum256(secret)
	return subtle.ConstantTimeCompare(stored, h[:]) == 1
}

func setTakeoverSecret(ctx context.Context, tx pgx.Tx, node string, secret []byte) error {
	if len(secret) == 0 {
		return nil
	}
	h := sha256.Sum256(secret)
	_, err := tx.Exec(ctx, `INSERT INTO compute.node_takeover_secrets (node_id, secret_hash) VALUES ($1, $2)
		ON CONFLICT (node_id) DO UPDATE SET secret_hash = excluded.secret_hash`, node, h[:])
	return err
}

// CAHash is the pin of a CA certificate, kubeadm's form: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo. A joining node compares it before trusting the CA it is sent.
func CAHash(ca *x509.Certificate) string {
	h := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(h[:])
}
