package nodes

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/lib/tpmattest"
	"github.com/better-compute/compute/modules"
)

// How an attested node's EK came to be trusted, as facts and events say.
const (
	TrustEKRoots  = "ekRoots"  // its certificate chains to one of the pool's ekRoots
	TrustFirstUse = "firstUse" // the pool has no ekRoots: trusted on first use, then pinned to the node
)

// joinBinding is the digest of what a join asks besides its TPM evidence (token, CSR, facts): a
// challenge's ticket is good only for a second Join that asks the same.
func joinBinding(req *agentv1.JoinRequest) []byte {
	h := sha256.New()
	f := req.GetFacts()
	h.Write([]byte("better-compute tpm join binding v1"))
	for _, v := range []string{req.GetToken(), string(req.GetCsrDer()), f.GetHostname(), f.GetMachineId(), f.GetOs(),
		f.GetKernel(), f.GetArch(), f.GetAgentVersion()} {
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(v))))
		h.Write([]byte(v))
	}
	return h.Sum(nil)
}

// challenge answers a first Join with TPM evidence. It spends nothing and writes nothing: the
// ticket it seals carries all the second Join needs. It reads only the clock.
func (m *Module) challenge(ctx context.Context, rt *modules.Runtime, ev *agentv1.TPMEvidence, binding []byte) (*agentv1.JoinResponse, error) {
	now, err := rt.Clock.Now(ctx, rt.DB.Pool)
	if err != nil {
		return nil, err
	}
	ch, err := tpmattest.Challenge(rt.Secrets, ev, binding, now)
	if errors.Is(err, tpmattest.ErrInvalid) {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err != nil {
		return nil, err
	}
	return &agentv1.JoinResponse{TpmChallenge: ch}, nil
}

// attestation is what a join's TPM evidence established, under its pool's policy.
type attestation struct {
	*tpmattest.Attestation
	trust string
	at    time.Time
}

// attest applies the pool's attestation policy to a join's evidence (nil: none sent): checked
// reports whether the policy looks at TPM evidence at all (not off); att is what was verified,
// nil when nothing was sent or the policy is off. A refusal is a connect error saying why.
func attest(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, poolID string, ev *agentv1.TPMEvidence, binding []byte) (checked bool, att *attestation, err error) {
	policy, err := fleet.PoolAttestation(ctx, tx, poolID)
	if err != nil {
		return false, nil, err
	}
	switch {
	case policy.TPM == api.TPMOff:
		return false, nil, nil
	case ev == nil && policy.TPM == api.TPMRequired:
		return true, nil, connect.NewError(connect.CodePermissionDenied,
			errors.New("the pool requires TPM attestation, and this join has none: join with the machine's TPM (bcd join --tpm /dev/tpmrm0)"))
	case ev == nil:
		return true, nil, nil
	}
	now, err := rt.Clock.Now(ctx, tx)
	if err != nil {
		return true, nil, err
	}
	a, err := tpmattest.Verify(rt.Secrets, ev, binding, now)
	if errors.Is(err, tpmattest.ErrInvalid) {
		return true, nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err != nil {
		return true, nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("TPM attestation refused: %w", err))
	}
	trust := TrustFirstUse
	if len(policy.EKRoots) > 0 {
		roots, err := tpmattest.ParseRoots(policy.EKRoots)
		if err != nil {
			return true, nil, fmt.Errorf("pool %s: %w", poolID, err)
		}
		if err := a.CheckRoots(roots, now); err != nil {
			return true, nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("TPM attestation refused: %w", err))
		}
		trust = TrustEKRoots
	}
	return true, &attestation{Attestation: a, trust: trust, at: now}, nil
}

// facts is how an attestation is kept in the node's facts, under "tpm".
func (a *attestation) facts() map[string]any {
	pcrs := map[string]string{}
	for i, v := range a.PCRs {
		pcrs[strconv.Itoa(i)] = hex.EncodeToString(v)
	}
	f := map[string]any{
		"ekFingerprint": a.EKFingerprint, "trust": a.trust, "akName": hex.EncodeToString(a.AKName),
		"pcrBank": "sha256", "pcrs": pcrs, "nonce": hex.EncodeToString(a.Nonce), "attestedAt": a.at,
	}
	if c := a.EKCertificate; c != nil {
		f["ekCertificate"] = map[string]any{"issuer": c.Issuer.String(), "subject": c.Subject.String(),
			"serial": c.SerialNumber.Text(16), "notAfter": c.NotAfter}
	}
	return f
}

// event is the data of node.attested.
func (a *attestation) event(pool, name string) map[string]any {
	pcrs := make([]string, len(a.PCRs))
	for i, v := range a.PCRs {
		pcrs[i] = hex.EncodeToString(v)
	}
	return map[string]any{"pool": pool, "name": name, "ekFingerprint": a.EKFingerprint, "trust": a.trust, "pcrs": pcrs}
}

// checkPinned refuses what an earlier attestation of node id rules out: its ticket used again (a
// replayed second Join), or, for a takeover by takeover secret, a join without the node's TPM or
// with another one. An operator's takeover token may bring another TPM (a replaced board).
func checkPinned(c claim, id, name, pinnedEK, usedNonce string) error {
	if !c.tpmChecked {
		return nil
	}
	if c.att != nil && usedNonce != "" && usedNonce == hex.EncodeToString(c.att.Nonce) {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("TPM attestation refused: this ticket already admitted node %s; a replayed join admits nothing", id))
	}
	if c.scoped != nil || pinnedEK == "" {
		return nil
	}
	if c.att == nil {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
			"node %q (%s) was attested with the TPM of EK %s; join it again with that TPM (bcd join --rejoin --tpm …), or, if its TPM was replaced, with a takeover token (joinTokens create --node %s)",
			name, id, pinnedEK, id))
	}
	if c.att.EKFingerprint != pinnedEK {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
			"TPM attestation refused: node %q (%s) was attested with the TPM of EK %s, and this machine's is %s; if its TPM was replaced, take it over with a takeover token (joinTokens create --node %s)",
			name, id, pinnedEK, c.att.EKFingerprint, id))
	}
	return nil
}
