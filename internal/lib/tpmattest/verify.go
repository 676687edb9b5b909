package tpmattest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	pb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm-tools/quote"
	"github.com/google/go-tpm/tpm2"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Sealer seals tickets with a key derived from the control plane's secret, and opens them: the
// runtime's SecretBox (pki.SecretCipher's AES-256-GCM, for a purpose).
type Sealer interface {
	Seal(purpose string, plaintext []byte) ([]byte, error)
	Open(purpose string, sealed []byte) ([]byte, error)
}

// TicketPurpose is what tickets are sealed for: a value sealed for anything else does not open.
const TicketPurpose = "tpm join ticket v1"

// TicketLifetime is how long a challenge may be answered: long enough for a TPM, short enough
// that a ticket is worth nothing by the time anyone could have copied it out of a log.
const TicketLifetime = 5 * time.Minute

// ticket is what the control plane remembers of a challenge, carried by the node, sealed. It
// binds the expected secret and nonce to the keys the challenge was made for and to the rest of
// the join (token, CSR, facts: binding), until Expires.
type ticket struct {
	Secret  []byte    `json:"secret"`
	Nonce   []byte    `json:"nonce"`
	AKName  []byte    `json:"akName"`
	EK      []byte    `json:"ek"` // SHA-256 of the EK's TPMT_PUBLIC
	Binding []byte    `json:"binding"`
	Expires time.Time `json:"expires"`
}

// Challenge answers a first Join: it checks the EK and the AK (and that the EK certificate, if
// any, is the EK's), makes a credential for the AK's name under the EK (TPM2_MakeCredential, in
// software) and a nonce, and seals a ticket binding them to binding (the digest of the join's
// token, CSR and facts) until now+TicketLifetime. It writes nothing anywhere.
func Challenge(s Sealer, ev *agentv1.TPMEvidence, binding []byte, now time.Time) (*agentv1.TPMChallenge, error) {
	if len(ev.GetTicket()) > 0 {
		return nil, fmt.Errorf("%w: a first Join carries no ticket", ErrInvalid)
	}
	keys, err := parseKeys(ev)
	if err != nil {
		return nil, err
	}
	ek, err := tpm2.ImportEncapsulationKey(keys.ek)
	if err != nil {
		return nil, fmt.Errorf("%w: tpm.ek_public: %v", ErrInvalid, err)
	}
	t := ticket{Secret: make([]byte, 32), Nonce: make([]byte, 32), AKName: keys.akName, EK: keys.ekDigest,
		Binding: binding, Expires: now.Add(TicketLifetime).UTC()}
	if _, err := rand.Read(t.Secret); err != nil {
		return nil, err
	}
	if _, err := rand.Read(t.Nonce); err != nil {
		return nil, err
	}
	blob, secret, err := tpm2.CreateCredential(rand.Reader, ek, keys.akName, t.Secret)
	if err != nil {
		return nil, fmt.Errorf("tpm: make the credential: %w", err)
	}
	plain, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	sealed, err := s.Seal(TicketPurpose, plain)
	if err != nil {
		return nil, err
	}
	return &agentv1.TPMChallenge{CredentialBlob: blob, EncryptedSecret: secret, Nonce: t.Nonce, Ticket: sealed,
		ExpiresAt: timestamppb.New(t.Expires)}, nil
}

// Attestation is what a verified answer established: the AK lives in the TPM of this EK, and
// that TPM quoted these PCR values for this join.
type Attestation struct {
	EKFingerprint string            // Fingerprint of the EK's key
	EKCertificate *x509.Certificate // from the TPM's NV; nil when it holds none
	AKName        []byte
	PCRs          [][]byte // SHA-256 values of PCRs 0-7
	Nonce         []byte   // the challenge's: one per ticket
}

// Verify checks a second Join's answer. It opens the ticket (refused if altered, made by
// another control plane, or expired at now), checks that it was made for this join (binding) and
// these keys, that the activated secret is the ticket's (only the TPM holding the EK could
// recover it, and only for an AK of the ticket's name), and that the quote is signed by the AK,
// over the ticket's nonce and the PCR values sent. Whether the EK is trusted is the caller's
// policy (CheckRoots, or trust on first use).
func Verify(s Sealer, ev *agentv1.TPMEvidence, binding []byte, now time.Time) (*Attestation, error) {
	keys, err := parseKeys(ev)
	if err != nil {
		return nil, err
	}
	plain, err := s.Open(TicketPurpose, ev.GetTicket())
	if err != nil {
		return nil, errors.New("the TPM ticket does not open: it was altered, or made by another control plane (or before its secret changed)")
	}
	var t ticket
	if err := json.Unmarshal(plain, &t); err != nil {
		return nil, fmt.Errorf("the TPM ticket does not read: %w", err)
	}
	switch {
	case !now.Before(t.Expires):
		return nil, fmt.Errorf("the TPM challenge expired at %s; join again", t.Expires.Format(time.RFC3339))
	case subtle.ConstantTimeCompare(t.Binding, binding) != 1:
		return nil, errors.New("the TPM ticket was made for another join request (token, CSR or facts differ)")
	case !bytes.Equal(t.EK, keys.ekDigest):
		return nil, errors.New("the TPM ticket was made for another endorsement key")
	case !bytes.Equal(t.AKName, keys.akName):
		return nil, errors.New("the TPM ticket was made for another attestation key")
	case subtle.ConstantTimeCompare(t.Secret, ev.GetActivatedSecret()) != 1:
		return nil, errors.New("the activated secret is not the credential's: the AK is not in the TPM of the EK")
	}
	if len(ev.GetPcrs()) != QuotedPCRs {
		return nil, fmt.Errorf("%w: tpm.pcrs must hold PCRs 0-7 (%d values)", ErrInvalid, QuotedPCRs)
	}
	pcrs := &pb.PCRs{Hash: pb.HashAlgo_SHA256, Pcrs: map[uint32][]byte{}}
	for i, v := range ev.GetPcrs() {
		if len(v) != sha256.Size {
			return nil, fmt.Errorf("%w: tpm.pcrs[%d] is not a SHA-256 value", ErrInvalid, i)
		}
		pcrs.Pcrs[uint32(i)] = v
	}
	q := &pb.Quote{Quote: ev.GetQuote(), RawSig: ev.GetQuoteSignature(), Pcrs: pcrs}
	if err := quote.Verify(q, keys.akKey, t.Nonce); err != nil {
		return nil, fmt.Errorf("the quote does not verify with the AK over the challenge's nonce and these PCRs: %w", err)
	}
	fp, err := Fingerprint(keys.ekKey)
	if err != nil {
		return nil, err
	}
	return &Attestation{EKFingerprint: fp, EKCertificate: keys.ekCert, AKName: keys.akName, PCRs: ev.GetPcrs(), Nonce: t.Nonce}, nil
}

// keys are the evidence's EK and AK, checked.
type keys struct {
	ek       *tpm2.TPMTPublic
	ekKey    any
	ekDigest []byte
	ekCert   *x509.Certificate
	akKey    any
	akName   []byte
}

func parseKeys(ev *agentv1.TPMEvidence) (keys, error) {
	var k keys
	ek, ekKey, err := parsePublic("ek_public", ev.GetEkPublic())
	if err != nil {
		return k, err
	}
	if err := checkEK(ek); err != nil {
		return k, err
	}
	ak, akKey, err := parsePublic("ak_public", ev.GetAkPublic())
	if err != nil {
		return k, err
	}
	if err := checkAK(ak); err != nil {
		return k, err
	}
	name, err := tpm2.ObjectName(ak)
	if err != nil {
		return k, fmt.Errorf("%w: tpm.ak_public: %v", ErrInvalid, err)
	}
	h := sha256.Sum256(ev.GetEkPublic())
	k = keys{ek: ek, ekKey: ekKey, ekDigest: h[:], akKey: akKey, akName: name.Buffer}
	if der := ev.GetEkCertificateDer(); len(der) > 0 {
		if err := certFor(der, ev.GetEkPublic()); err != nil {
			return k, err
		}
		k.ekCert, _ = parseEKCert(der)
	}
	return k, nil
}
