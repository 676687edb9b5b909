// Package tufrepo is the signing side of bcd's release repository, a repository of The Update
// Framework (TUF, through go-tuf): the keys of its four roles, root metadata, targets metadata
// naming each bcd build by version, OS and architecture, and the snapshot and timestamp the
// control plane signs with its online keys. The root and targets keys are files on the machine
// of whoever signs releases (better-compute releases init and sign); the control plane holds
// only the snapshot and timestamp keys, derived from its secret (docs/releases.md).
package tufrepo

import (
	"crypto"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/theupdateframework/go-tuf/v2/metadata"
)

// The top-level roles.
const (
	Root      = metadata.ROOT
	Targets   = metadata.TARGETS
	Snapshot  = metadata.SNAPSHOT
	Timestamp = metadata.TIMESTAMP
)

// Default lifetimes of each role's metadata. The online roles are signed again by the control
// plane before half of their life has passed; root and targets are signed offline, so they live
// long and their signer renews them (a new root, or a new targets version).
const (
	DefaultRootLifetime      = 365 * 24 * time.Hour
	DefaultTargetsLifetime   = 90 * 24 * time.Hour
	DefaultSnapshotLifetime  = 7 * 24 * time.Hour
	DefaultTimestampLifetime = 24 * time.Hour
)

var versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidVersion reports whether v may name a release: letters, digits and "._-", 64 characters at
// most, starting with a letter or digit (v1.4.0, 2026.07.1-rc1). It is what bcd built with
// -X …/bcd/app.version=v reports, and what a rollout's nodes must come back with.
func ValidVersion(v string) bool { return versionRE.MatchString(v) }

var platformRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// TargetName is the TUF target path of bcd version for goos/goarch: bcd-v1.4.0-linux-amd64.
func TargetName(version, goos, goarch string) string {
	return "bcd-" + version + "-" + goos + "-" + goarch
}

// Build is what a target's custom metadata says it is: which bcd, for which platform. It is
// signed with the target's hashes, so a node installs a build only as what the targets key said
// it is.
type Build struct {
	Version string `json:"version"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
}

// Check reports what is wrong with b, naming the field.
func (b Build) Check() error {
	switch {
	case !ValidVersion(b.Version):
		return fmt.Errorf("version %q: use letters, digits and '._-', 64 characters at most, starting with a letter or digit", b.Version)
	case !platformRE.MatchString(b.OS):
		return fmt.Errorf("os %q: a GOOS such as linux", b.OS)
	case !platformRE.MatchString(b.Arch):
		return fmt.Errorf("arch %q: a GOARCH such as amd64", b.Arch)
	}
	return nil
}

// BuildOf reads the build a target of name says it is, and checks that its name agrees.
func BuildOf(name string, t *metadata.TargetFiles) (Build, error) {
	var b Build
	if t.Custom == nil {
		return b, fmt.Errorf("target %s has no custom metadata naming its version, os and arch", name)
	}
	if err := json.Unmarshal(*t.Custom, &b); err != nil {
		return b, fmt.Errorf("target %s: custom metadata: %w", name, err)
	}
	if err := b.Check(); err != nil {
		return b, fmt.Errorf("target %s: %w", name, err)
	}
	if want := TargetName(b.Version, b.OS, b.Arch); name != want {
		return b, fmt.Errorf("target %s says it is %s %s/%s, whose name is %s", name, b.Version, b.OS, b.Arch, want)
	}
	return b, nil
}

// OnlineKeys derives the control plane's snapshot and timestamp keys from its secret: the same
// keys in every process, none stored. A new secret makes new keys, which a new root must name.
func OnlineKeys(secret string) (snapshot, timestamp ed25519.PrivateKey, err error) {
	derive := func(info string) (ed25519.PrivateKey, error) {
		seed, err := hkdf.Key(sha256.New, []byte(secret), nil, info, ed25519.SeedSize)
		if err != nil {
			return nil, err
		}
		return ed25519.NewKeyFromSeed(seed), nil
	}
	if snapshot, err = derive("better-compute releases snapshot key v1"); err != nil {
		return nil, nil, err
	}
	timestamp, err = derive("better-compute releases timestamp key v1")
	return snapshot, timestamp, err
}

// KeyID is the TUF key id of an Ed25519 public key.
func KeyID(pub ed25519.PublicKey) (string, error) {
	k, err := metadata.KeyFromPublicKey(pub)
	if err != nil {
		return "", err
	}
	return k.ID()
}

// RootKeys are the public keys a root delegates each role to.
type RootKeys struct {
	Root          []ed25519.PublicKey
	RootThreshold int // default 1
	Targets       []ed25519.PublicKey
	Snapshot      ed25519.PublicKey
	Timestamp     ed25519.PublicKey
}

// NewRoot makes unsigned root metadata of version, with consistent snapshots (every version of
// snapshot and targets metadata, and every target by its hash, stays fetchable while a node
// updates).
func NewRoot(version int64, keys RootKeys, expires time.Time) (*metadata.Metadata[metadata.RootType], error) {
	if len(keys.Root) == 0 || len(keys.Targets) == 0 || keys.Snapshot == nil || keys.Timestamp == nil {
		return nil, errors.New("tufrepo: a root needs root, targets, snapshot and timestamp keys")
	}
	threshold := max(keys.RootThreshold, 1)
	if threshold > len(keys.Root) {
		return nil, fmt.Errorf("tufrepo: a root threshold of %d needs as many root keys, not %d", threshold, len(keys.Root))
	}
	r := metadata.Root(expires.UTC().Truncate(time.Second))
	r.Signed.Version = version
	r.Signed.ConsistentSnapshot = true
	add := func(role string, pubs ...ed25519.PublicKey) error {
		for _, p := range pubs {
			k, err := metadata.KeyFromPublicKey(p)
			if err != nil {
				return err
			}
			if err := r.Signed.AddKey(k, role); err != nil {
				return err
			}
		}
		return nil
	}
	for _, err := range []error{add(Root, keys.Root...), add(Targets, keys.Targets...), add(Snapshot, keys.Snapshot), add(Timestamp, keys.Timestamp)} {
		if err != nil {
			return nil, fmt.Errorf("tufrepo: %w", err)
		}
	}
	r.Signed.Roles[Root].Threshold = threshold
	return r, nil
}

// signer is an Ed25519 key as go-tuf signs with it.
func signer(k ed25519.PrivateKey) (signature.Signer, error) {
	return signature.LoadSigner(k, crypto.Hash(0))
}

// Sign adds a signature by each key to md.
func Sign[T metadata.Roles](md *metadata.Metadata[T], keys ...ed25519.PrivateKey) error {
	for _, k := range keys {
		s, err := signer(k)
		if err != nil {
			return fmt.Errorf("tufrepo: %w", err)
		}
		if _, err := md.Sign(s); err != nil {
			return fmt.Errorf("tufrepo: sign: %w", err)
		}
	}
	return nil
}

// AddBuild lists the bcd build read from r in targets as b (its length and SHA-256), replacing
// an entry of the same name.
func AddBuild(t *metadata.Metadata[metadata.TargetsType], b Build, r io.Reader) (*metadata.TargetFiles, error) {
	if err := b.Check(); err != nil {
		return nil, fmt.Errorf("tufrepo: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: read the build: %w", err)
	}
	if n == 0 {
		return nil, errors.New("tufrepo: the build is empty")
	}
	custom, _ := json.Marshal(b)
	raw := json.RawMessage(custom)
	name := TargetName(b.Version, b.OS, b.Arch)
	tf := &metadata.TargetFiles{Length: n, Hashes: metadata.Hashes{"sha256": h.Sum(nil)}, Custom: &raw, Path: name}
	if t.Signed.Targets == nil {
		t.Signed.Targets = map[string]*metadata.TargetFiles{}
	}
	t.Signed.Targets[name] = tf
	return tf, nil
}

// SHA256 is a target's SHA-256, in hex: how the control plane stores its bytes.
func SHA256(t *metadata.TargetFiles) (string, error) {
	h, ok := t.Hashes["sha256"]
	if !ok || len(h) != sha256.Size {
		return "", errors.New("tufrepo: the target has no SHA-256")
	}
	return hex.EncodeToString(h), nil
}

// NextTargets returns the targets metadata that follows prev (nil: the first): its targets,
// the next version, a new expiry, no signatures.
func NextTargets(prev *metadata.Metadata[metadata.TargetsType], expires time.Time) *metadata.Metadata[metadata.TargetsType] {
	t := metadata.Targets(expires.UTC().Truncate(time.Second))
	if prev != nil {
		t.Signed.Version = prev.Signed.Version + 1
		for name, tf := range prev.Signed.Targets {
			tf.Path = name
			t.Signed.Targets[name] = tf
		}
	}
	return t
}

// NewSnapshot makes and signs snapshot metadata of version listing targets metadata of
// targetsVersion.
func NewSnapshot(version, targetsVersion int64, expires time.Time, key ed25519.PrivateKey) ([]byte, error) {
	s := metadata.Snapshot(expires.UTC().Truncate(time.Second))
	s.Signed.Version = version
	s.Signed.Meta[Targets+".json"] = metadata.MetaFile(targetsVersion)
	if err := Sign(s, key); err != nil {
		return nil, err
	}
	return s.ToBytes(false)
}

// NewTimestamp makes and signs timestamp metadata of version listing snapshot metadata of
// snapshotVersion, with its length and hash: a node then fetches exactly those bytes.
func NewTimestamp(version int64, snapshot []byte, snapshotVersion int64, expires time.Time, key ed25519.PrivateKey) ([]byte, error) {
	t := metadata.Timestamp(expires.UTC().Truncate(time.Second))
	t.Signed.Version = version
	sum := sha256.Sum256(snapshot)
	mf := metadata.MetaFile(snapshotVersion)
	mf.Length = int64(len(snapshot))
	mf.Hashes = metadata.Hashes{"sha256": sum[:]}
	t.Signed.Meta[Snapshot+".json"] = mf
	if err := Sign(t, key); err != nil {
		return nil, err
	}
	return t.ToBytes(false)
}

// Where a gateway serves the repository to nodes, over their mutual TLS: metadata as TUF names
// it (timestamp.json, N.root.json, N.snapshot.json, N.targets.json) under MetadataPath, and
// targets by hash (<sha256>.<target>) under TargetsPath.
const (
	NodePath     = "/releases/v1/"
	MetadataPath = NodePath + "metadata/"
	TargetsPath  = NodePath + "targets/"
)
