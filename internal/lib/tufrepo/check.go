package tufrepo

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"
	"github.com/theupdateframework/go-tuf/v2/metadata/trustedmetadata"
)

// CheckRoot verifies next as the repository's next root: the first (version 1, signed by a
// threshold of its own root keys), or one that follows prev (version prev+1, signed by a
// threshold of prev's root keys and of its own), exactly as a node's updater will check it. It
// must use consistent snapshots, delegate snapshot and timestamp to the control plane's online
// keys alone (or the control plane could not sign them), and not be expired at now.
func CheckRoot(prev, next []byte, snapshot, timestamp ed25519.PublicKey, now time.Time) (*metadata.Metadata[metadata.RootType], error) {
	var root *metadata.Metadata[metadata.RootType]
	if prev == nil {
		tm, err := trustedmetadata.New(next)
		if err != nil {
			return nil, fmt.Errorf("the root is not signed by a threshold of its own root keys: %w", err)
		}
		root = tm.Root
		if v := root.Signed.Version; v != 1 {
			return nil, fmt.Errorf("the repository's first root must be version 1, not %d", v)
		}
	} else {
		tm, err := trustedmetadata.New(prev)
		if err != nil {
			return nil, fmt.Errorf("the current root: %w", err)
		}
		if root, err = tm.UpdateRoot(next); err != nil {
			return nil, fmt.Errorf("the root does not follow the current one (version %d, signed by a threshold of its root keys and of its own): %w", tm.Root.Signed.Version, err)
		}
	}
	s := root.Signed
	if !s.ConsistentSnapshot {
		return nil, errors.New("the root must set consistent_snapshot: nodes fetch metadata and targets by version and hash")
	}
	if s.IsExpired(now) {
		return nil, fmt.Errorf("the root expired at %s", s.Expires.Format(time.RFC3339))
	}
	for _, want := range []struct {
		role string
		key  ed25519.PublicKey
	}{{Snapshot, snapshot}, {Timestamp, timestamp}} {
		id, err := KeyID(want.key)
		if err != nil {
			return nil, err
		}
		r := s.Roles[want.role]
		if r == nil || r.Threshold != 1 || !slices.Equal(r.KeyIDs, []string{id}) {
			return nil, fmt.Errorf("the root must delegate %s to this control plane's online key %s alone, threshold 1 (releases.keys)", want.role, id)
		}
	}
	if r := s.Roles[Targets]; r == nil || len(r.KeyIDs) == 0 || r.Threshold < 1 {
		return nil, errors.New("the root delegates targets to no key")
	}
	if t := s.Roles[Targets]; t != nil {
		for _, online := range []ed25519.PublicKey{snapshot, timestamp} {
			id, _ := KeyID(online)
			if slices.Contains(t.KeyIDs, id) {
				return nil, errors.New("the root delegates targets to an online key of the control plane: the targets key must be one kept offline")
			}
		}
	}
	return root, nil
}

// CheckTargets verifies next as the targets metadata that follows version prevVersion (0: none
// yet) under root: signed by a threshold of the targets keys, the next version, not expired at
// now, no delegations, and every target a bcd build named for its version and platform.
func CheckTargets(root *metadata.Metadata[metadata.RootType], prevVersion int64, next []byte, now time.Time) (*metadata.Metadata[metadata.TargetsType], error) {
	t, err := metadata.Targets().FromBytes(next)
	if err != nil {
		return nil, fmt.Errorf("not targets metadata: %w", err)
	}
	if t.Signed.Type != Targets {
		return nil, fmt.Errorf("metadata of type %q, not targets", t.Signed.Type)
	}
	if err := root.VerifyDelegate(Targets, t); err != nil {
		return nil, fmt.Errorf("not signed by a threshold of the root's targets keys: %w", err)
	}
	if t.Signed.Version != prevVersion+1 {
		return nil, fmt.Errorf("version %d does not follow the repository's targets version %d (sign the current targets metadata's successor)", t.Signed.Version, prevVersion)
	}
	if t.Signed.IsExpired(now) {
		return nil, fmt.Errorf("expired at %s", t.Signed.Expires.Format(time.RFC3339))
	}
	if t.Signed.Delegations != nil {
		return nil, errors.New("delegated targets roles are not supported: list every build in the top-level targets")
	}
	for name, tf := range t.Signed.Targets {
		if _, err := BuildOf(name, tf); err != nil {
			return nil, err
		}
		if _, err := SHA256(tf); err != nil {
			return nil, fmt.Errorf("target %s: %w", name, err)
		}
		if tf.Length <= 0 {
			return nil, fmt.Errorf("target %s: length %d", name, tf.Length)
		}
	}
	return t, nil
}

// WriteKeyFile writes a new private key to path (PKCS #8 in PEM, mode 0600). It refuses to
// replace a file: a key lost is a root to rotate.
func WriteKeyFile(path string, k ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("tufrepo: write key: %w", err)
	}
	if err := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		f.Close()
		return fmt.Errorf("tufrepo: write key %s: %w", path, err)
	}
	return f.Close()
}

// ReadKeyFile reads an Ed25519 private key that WriteKeyFile wrote.
func ReadKeyFile(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: read key: %w", err)
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("tufrepo: %s is not a PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: %s: %w", path, err)
	}
	ed, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("tufrepo: %s holds a %T key; release keys are Ed25519", path, k)
	}
	return ed, nil
}
