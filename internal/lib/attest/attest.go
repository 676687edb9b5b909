// Package attest signs and verifies a node's attested reports (agent/v1 Attested): command
// results and inventories signed with the key of the node's session certificate, bound to the
// node, its session's epoch and an order within the session. bcd signs; the gateway verifies
// before it records anything.
package attest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// domain separates these signatures from any other the node's key makes (its TLS handshakes).
const domain = "better-compute attested v1\n"

// Sign serializes body and signs it with key: ECDSA over the SHA-256 of the domain and the
// body, or Ed25519 over the domain and the body.
func Sign(key crypto.Signer, body *agentv1.AttestedBody) (*agentv1.Attested, error) {
	b, err := proto.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("attest: %w", err)
	}
	var sig []byte
	switch key.Public().(type) {
	case ed25519.PublicKey:
		sig, err = key.Sign(rand.Reader, append([]byte(domain), b...), crypto.Hash(0))
	case *ecdsa.PublicKey:
		d := digest(b)
		sig, err = key.Sign(rand.Reader, d[:], crypto.SHA256)
	default:
		return nil, fmt.Errorf("attest: a %T key cannot sign reports", key.Public())
	}
	if err != nil {
		return nil, fmt.Errorf("attest: sign: %w", err)
	}
	return &agentv1.Attested{Body: b, Signature: sig}, nil
}

func digest(body []byte) [32]byte {
	return sha256.Sum256(append([]byte(domain), body...))
}

// ErrForged is a report whose signature is not its node's.
var ErrForged = errors.New("attest: the signature is not the node's")

// Verify checks a's signature with pub, the public key of the session's certificate, and returns
// its body. It does not check the body's node, epoch and order: the caller knows them.
func Verify(pub crypto.PublicKey, a *agentv1.Attested) (*agentv1.AttestedBody, error) {
	ok := false
	switch k := pub.(type) {
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, append([]byte(domain), a.GetBody()...), a.GetSignature())
	case *ecdsa.PublicKey:
		d := digest(a.GetBody())
		ok = ecdsa.VerifyASN1(k, d[:], a.GetSignature())
	default:
		return nil, fmt.Errorf("attest: a %T key signs no reports", pub)
	}
	if !ok {
		return nil, ErrForged
	}
	var body agentv1.AttestedBody
	if err := proto.Unmarshal(a.GetBody(), &body); err != nil {
		return nil, fmt.Errorf("attest: the body: %w", err)
	}
	return &body, nil
}
