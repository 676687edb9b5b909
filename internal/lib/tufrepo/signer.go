package tufrepo

import (
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"
)

// What the holder of the offline keys does (better-compute releases init and sign), as
// functions of bytes and keys: nothing here needs the control plane, so it can run on a
// machine that never reaches it.

// ParsePublicKey reads an Ed25519 public key in hex (releases.keys answers them so).
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("tufrepo: %q is not an Ed25519 public key in hex", s)
	}
	return ed25519.PublicKey(b), nil
}

// SignRoot makes root metadata of version delegating to keys, expiring at exp, signed by every
// key of signers (the new root's keys and, for a rotation, the current root's).
func SignRoot(version int64, keys RootKeys, exp time.Time, signers ...ed25519.PrivateKey) ([]byte, error) {
	r, err := NewRoot(version, keys, exp)
	if err != nil {
		return nil, err
	}
	if err := Sign(r, signers...); err != nil {
		return nil, err
	}
	return r.ToBytes(true)
}

// BuildFile is a build to list, and its bytes.
type BuildFile struct {
	Build
	Bytes io.Reader
}

// SignTargets returns the targets metadata that follows prev (nil: the first) with builds added
// (a build of the same name replaced), expiring at exp, signed by key.
func SignTargets(prev []byte, builds []BuildFile, key ed25519.PrivateKey, exp time.Time) ([]byte, error) {
	var p *metadata.Metadata[metadata.TargetsType]
	if prev != nil {
		var err error
		if p, err = metadata.Targets().FromBytes(prev); err != nil {
			return nil, fmt.Errorf("tufrepo: the current targets: %w", err)
		}
	}
	t := NextTargets(p, exp)
	for _, b := range builds {
		if _, err := AddBuild(t, b.Build, b.Bytes); err != nil {
			return nil, err
		}
	}
	if err := Sign(t, key); err != nil {
		return nil, err
	}
	return t.ToBytes(true)
}
