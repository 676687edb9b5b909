package tpmattest

import (
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// The NV indices of EK certificates (TCG EK Credential Profile 2.0, section 2.2.1.4): the RSA
// 2048 EK's and the ECC P-256 EK's, each for the EK of the standard (low range) template.
const (
	EKCertIndexRSA = 0x01c00002
	EKCertIndexECC = 0x01c0000a
)

// Node is a TPM's side of an attested join: its EK (with its certificate, when the TPM holds
// one) and a new AK, both loaded until Close.
type Node struct {
	tpm      transport.TPM
	ek, ak   tpm2.NamedHandle
	ekPublic []byte // TPMT_PUBLIC
	akPublic []byte
	ekCert   []byte
}

// NewNode loads the TPM's EK and makes a new AK on the TPM at rw (a device such as /dev/tpmrm0,
// or a connection from Open). The EK is the RSA 2048 EK of the standard template, or the ECC
// P-256 one where the TPM has a certificate only for that; its certificate is read from NV. The
// AK is a primary ECDSA P-256 key of the owner hierarchy whose template carries random bytes, so
// each join has an AK of its own. Call Close to flush them.
func NewNode(rw io.ReadWriter) (*Node, error) {
	n := &Node{tpm: transport.FromReadWriter(rw)}
	cert, _ := n.readNV(EKCertIndexRSA)
	template := tpm2.RSAEKTemplate
	if cert == nil {
		if c, err := n.readNV(EKCertIndexECC); err == nil && c != nil {
			cert, template = c, tpm2.ECCEKTemplate
		}
	}
	ek, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHEndorsement, InPublic: tpm2.New2B(template)}.Execute(n.tpm)
	if err != nil {
		return nil, fmt.Errorf("tpm: create the endorsement key: %w", err)
	}
	n.ek = tpm2.NamedHandle{Handle: ek.ObjectHandle, Name: ek.Name}
	n.ekPublic = ek.OutPublic.Bytes()
	if cert != nil {
		if err := certFor(cert, n.ekPublic); err != nil {
			n.Close()
			return nil, err
		}
		n.ekCert = cert
	}
	unique := make([]byte, 32)
	if _, err := rand.Read(unique); err != nil {
		n.Close()
		return nil, err
	}
	ak, err := tpm2.CreatePrimary{PrimaryHandle: tpm2.TPMRHOwner, InPublic: tpm2.New2B(akTemplate(unique))}.Execute(n.tpm)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("tpm: create an attestation key (the owner hierarchy must have an empty password): %w", err)
	}
	n.ak = tpm2.NamedHandle{Handle: ak.ObjectHandle, Name: ak.Name}
	n.akPublic = ak.OutPublic.Bytes()
	return n, nil
}

// akTemplate is an attestation key's: a restricted ECDSA P-256 signing key, SHA-256, fixed to
// the TPM. unique makes it a key of its own among the primaries of the owner hierarchy.
func akTemplate(unique []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type: tpm2.TPMAlgECC, NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{FixedTPM: true, FixedParent: true, SensitiveDataOrigin: true, UserWithAuth: true,
			NoDA: true, Restricted: true, SignEncrypt: true},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgECC, &tpm2.TPMSECCParms{
			Symmetric: tpm2.TPMTSymDefObject{Algorithm: tpm2.TPMAlgNull},
			Scheme: tpm2.TPMTECCScheme{Scheme: tpm2.TPMAlgECDSA,
				Details: tpm2.NewTPMUAsymScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSigSchemeECDSA{HashAlg: tpm2.TPMAlgSHA256})},
			CurveID: tpm2.TPMECCNistP256,
			KDF:     tpm2.TPMTKDFScheme{Scheme: tpm2.TPMAlgNull},
		}),
		Unique: tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
			X: tpm2.TPM2BECCParameter{Buffer: unique}, Y: tpm2.TPM2BECCParameter{Buffer: make([]byte, 32)}}),
	}
}

// readNV reads an NV index whole, with the owner's (empty) authorization; nil when the index is
// not defined.
func (n *Node) readNV(index tpm2.TPMHandle) ([]byte, error) {
	pub, err := tpm2.NVReadPublic{NVIndex: index}.Execute(n.tpm)
	if err != nil {
		return nil, nil // not defined (or not readable): no certificate
	}
	info, err := pub.NVPublic.Contents()
	if err != nil {
		return nil, err
	}
	var out []byte
	for off := uint16(0); off < info.DataSize; {
		size := min(info.DataSize-off, 512)
		r, err := tpm2.NVRead{
			AuthHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			NVIndex:    tpm2.NamedHandle{Handle: index, Name: pub.NVName},
			Size:       size, Offset: off,
		}.Execute(n.tpm)
		if err != nil {
			return nil, fmt.Errorf("tpm: read NV index %#x: %w", uint32(index), err)
		}
		out = append(out, r.Data.Buffer...)
		off += size
	}
	// An index may be larger than the certificate it holds (padded): keep the DER only.
	if cert, err := x509.ParseCertificate(out); err == nil {
		return cert.Raw, nil
	}
	return out, nil
}

// EKFingerprint is the Fingerprint of the TPM's EK, as the control plane records it.
func (n *Node) EKFingerprint() (string, error) {
	_, key, err := parsePublic("ek_public", n.ekPublic)
	if err != nil {
		return "", err
	}
	return Fingerprint(key)
}

// Evidence is what the first Join carries: the EK, its certificate and the AK.
func (n *Node) Evidence() *agentv1.TPMEvidence {
	return &agentv1.TPMEvidence{EkPublic: n.ekPublic, EkCertificateDer: n.ekCert, AkPublic: n.akPublic}
}

// Activate recovers the challenge's secret with TPM2_ActivateCredential: the TPM releases it
// only to the holder of the EK it was made for, and only for an object of the name it names,
// here the AK.
func (n *Node) Activate(ch *agentv1.TPMChallenge) ([]byte, error) {
	r, err := tpm2.ActivateCredential{
		ActivateHandle: tpm2.AuthHandle{Handle: n.ak.Handle, Name: n.ak.Name, Auth: tpm2.PasswordAuth(nil)},
		KeyHandle:      tpm2.AuthHandle{Handle: n.ek.Handle, Name: n.ek.Name, Auth: tpm2.Policy(tpm2.TPMAlgSHA256, 16, ekPolicy)},
		CredentialBlob: tpm2.TPM2BIDObject{Buffer: ch.GetCredentialBlob()},
		Secret:         tpm2.TPM2BEncryptedSecret{Buffer: ch.GetEncryptedSecret()},
	}.Execute(n.tpm)
	if err != nil {
		return nil, fmt.Errorf("tpm: activate the control plane's credential: %w", err)
	}
	return r.CertInfo.Buffer, nil
}

// ekPolicy satisfies the standard EK's policy: PolicySecret of the endorsement hierarchy (whose
// password is empty on a machine as it comes).
func ekPolicy(t transport.TPM, session tpm2.TPMISHPolicy, nonceTPM tpm2.TPM2BNonce) error {
	_, err := tpm2.PolicySecret{AuthHandle: tpm2.TPMRHEndorsement, PolicySession: session, NonceTPM: nonceTPM}.Execute(t)
	return err
}

// Quote has the AK sign PCRs 0-7 (SHA-256) with nonce as qualifying data, and reads their values.
func (n *Node) Quote(nonce []byte) (quote, signature []byte, pcrs [][]byte, err error) {
	q, err := tpm2.Quote{
		SignHandle:     tpm2.AuthHandle{Handle: n.ak.Handle, Name: n.ak.Name, Auth: tpm2.PasswordAuth(nil)},
		QualifyingData: tpm2.TPM2BData{Buffer: nonce},
		InScheme:       tpm2.TPMTSigScheme{Scheme: tpm2.TPMAlgNull},
		PCRSelect:      pcrSelection(),
	}.Execute(n.tpm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tpm: quote: %w", err)
	}
	pcrs, err = ReadPCRs(n.tpm)
	if err != nil {
		return nil, nil, nil, err
	}
	return q.Quoted.Bytes(), tpm2.Marshal(q.Signature), pcrs, nil
}

// ReadPCRs reads the SHA-256 values of PCRs 0-7.
func ReadPCRs(t transport.TPM) ([][]byte, error) {
	r, err := tpm2.PCRRead{PCRSelectionIn: pcrSelection()}.Execute(t)
	if err != nil {
		return nil, fmt.Errorf("tpm: read PCRs: %w", err)
	}
	if len(r.PCRValues.Digests) != QuotedPCRs {
		return nil, fmt.Errorf("tpm: read %d of PCRs 0-7 of the SHA-256 bank; is the bank active?", len(r.PCRValues.Digests))
	}
	out := make([][]byte, QuotedPCRs)
	for i, d := range r.PCRValues.Digests {
		out[i] = d.Buffer
	}
	return out, nil
}

// Answer is the second Join's evidence for a challenge: the keys again, the ticket, the
// activated secret and the quote over the nonce.
func (n *Node) Answer(ch *agentv1.TPMChallenge) (*agentv1.TPMEvidence, error) {
	secret, err := n.Activate(ch)
	if err != nil {
		return nil, err
	}
	quote, sig, pcrs, err := n.Quote(ch.GetNonce())
	if err != nil {
		return nil, err
	}
	ev := n.Evidence()
	ev.Ticket, ev.ActivatedSecret, ev.Quote, ev.QuoteSignature, ev.Pcrs = ch.GetTicket(), secret, quote, sig, pcrs
	return ev, nil
}

// Close flushes the EK and the AK from the TPM (it does not close the TPM).
func (n *Node) Close() error {
	var errs []error
	for _, h := range []tpm2.NamedHandle{n.ak, n.ek} {
		if h.Handle != 0 {
			if _, err := (tpm2.FlushContext{FlushHandle: h.Handle}).Execute(n.tpm); err != nil {
				errs = append(errs, err)
			}
		}
	}
	n.ak, n.ek = tpm2.NamedHandle{}, tpm2.NamedHandle{}
	return errors.Join(errs...)
}
