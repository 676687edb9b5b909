// Package tpmattest is a TPM attestor for joins, both halves: the node's TPM operations (its
// endorsement key and certificate, a new attestation key, credential activation, a quote of PCRs
// 0-7) and the control plane's checks (a challenge made for the AK under the EK with
// TPM2_MakeCredential semantics, a ticket sealed with the control plane's secret, and the
// verification of the answer). It decides nothing about pools: internal/core/nodes applies a pool's
// policy to what Verify established.
//
// The TPM commands are go-tpm's (the tpm2 API); the quote is verified with go-tpm-tools' quote
// package.
package tpmattest

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// ErrInvalid marks evidence that does not parse or is not of the kind asked for (an EK that is not
// an endorsement key, a certificate of another key): a request to fix, where every other error of
// Challenge and Verify is a refusal to explain.
var ErrInvalid = errors.New("invalid TPM evidence")

// QuotedPCRs is how many PCRs are quoted: 0 to 7 of the SHA-256 bank, what firmware and boot
// loaders measure on a PC (the TCG PC Client profile).
const QuotedPCRs = 8

// pcrSelection is the selection every quote is over: PCRs 0-7, SHA-256.
func pcrSelection() tpm2.TPMLPCRSelection {
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash: tpm2.TPMAlgSHA256, PCRSelect: tpm2.PCClientCompatible.PCRs(0, 1, 2, 3, 4, 5, 6, 7),
	}}}
}

// Fingerprint is how an EK is named in facts and events: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo, the form of the machine CA's pin, so that it can be compared with the key
// of an EK certificate by anyone with openssl.
func Fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(h[:]), nil
}

// parsePublic reads a TPMT_PUBLIC and its key.
func parsePublic(field string, b []byte) (*tpm2.TPMTPublic, crypto.PublicKey, error) {
	if len(b) == 0 {
		return nil, nil, fmt.Errorf("%w: tpm.%s is required", ErrInvalid, field)
	}
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](b)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: tpm.%s is not a TPMT_PUBLIC: %v", ErrInvalid, field, err)
	}
	// The name the TPM computes is over the bytes it holds: refuse any that do not read back as
	// sent, so that what was checked here is what was named.
	if !bytes.Equal(tpm2.Marshal(*pub), b) {
		return nil, nil, fmt.Errorf("%w: tpm.%s does not read back as sent (trailing bytes?)", ErrInvalid, field)
	}
	key, err := tpm2.Pub(*pub)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: tpm.%s: %v", ErrInvalid, field, err)
	}
	return pub, key, nil
}

// checkEK refuses an EK that is not a restricted decryption key fixed to its TPM: only such a
// key's TPM activates a credential for an object of its own.
func checkEK(pub *tpm2.TPMTPublic) error {
	a := pub.ObjectAttributes
	if !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.Restricted || !a.Decrypt || a.SignEncrypt {
		return fmt.Errorf("%w: tpm.ek_public is not an endorsement key (a restricted decryption key fixed to its TPM)", ErrInvalid)
	}
	return nil
}

// checkAK refuses an AK that is not a restricted signing key made in and fixed to its TPM: a
// restricted key signs only what the TPM itself produced (so a quote cannot be forged with it),
// and a key with fixedTPM cannot have been imported or duplicated, which is what makes an
// activated credential for its name a proof that it lives beside the EK.
func checkAK(pub *tpm2.TPMTPublic) error {
	a := pub.ObjectAttributes
	if !a.FixedTPM || !a.FixedParent || !a.SensitiveDataOrigin || !a.Restricted || !a.SignEncrypt || a.Decrypt {
		return fmt.Errorf("%w: tpm.ak_public is not an attestation key (a restricted signing key made in and fixed to its TPM)", ErrInvalid)
	}
	return nil
}
