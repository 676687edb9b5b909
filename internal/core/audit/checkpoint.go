package audit

import (
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// KeyInfo is HKDF's info when the checkpoint signing key is derived from the secret: a key of
// its own, which no other use of the secret shares.
const KeyInfo = "better-compute audit checkpoint signing key v1"

// OriginPrefix begins every log's origin; the rest is the first four bytes of SHA-256 of its
// public key, in hex, so that two deployments' checkpoints are never mistaken for each other.
const OriginPrefix = "better-compute/audit/"

// Key signs checkpoints: the Ed25519 key HKDF-SHA256 derives from compute.Options.Secret.
type Key struct {
	origin   string
	signer   note.Signer
	verifier string
}

// NewKey derives the checkpoint key of a deployment from its secret.
func NewKey(secret string) (*Key, error) {
	if secret == "" {
		return nil, errors.New("audit: no secret to derive the checkpoint key from")
	}
	seed, err := hkdf.Key(sha256.New, []byte(secret), nil, KeyInfo, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("audit: derive the checkpoint key: %w", err)
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	fp := sha256.Sum256(pub)
	origin := OriginPrefix + hex.EncodeToString(fp[:4])
	vkey, err := note.NewEd25519VerifierKey(origin, pub)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	// The note package reads signer keys only in its text form: name+hash+base64(alg || seed),
	// the hash being the verifier key's.
	hash := strings.Split(vkey, "+")[1]
	signer, err := note.NewSigner("PRIVATE+KEY+" + origin + "+" + hash + "+" + base64.StdEncoding.EncodeToString(append([]byte{1}, seed...)))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return &Key{origin: origin, signer: signer, verifier: vkey}, nil
}

// Origin is the log's name: the first line of its checkpoints, and the key's name.
func (k *Key) Origin() string { return k.origin }

// VerifierKey is the note verifier key of the checkpoints k signs (name+hash+key).
func (k *Key) VerifierKey() string { return k.verifier }

// Body is the text of a checkpoint, in the C2SP checkpoint format with one extension line:
//
//	<origin>
//	<size, decimal>
//	<root hash, base64>
//	time <RFC 3339, UTC>
func Body(origin string, size uint64, root []byte, at time.Time) string {
	return fmt.Sprintf("%s\n%d\n%s\ntime %s\n", origin, size, base64.StdEncoding.EncodeToString(root), at.UTC().Format(time.RFC3339Nano))
}

// Sign returns the signed note of a checkpoint.
func (k *Key) Sign(size uint64, root []byte, at time.Time) (string, error) {
	b, err := note.Sign(&note.Note{Text: Body(k.origin, size, root, at)}, k.signer)
	if err != nil {
		return "", fmt.Errorf("audit: sign a checkpoint: %w", err)
	}
	return string(b), nil
}

// CheckpointEvery is how often the publisher extends the tree with the events sequenced since
// the last checkpoint and publishes a new one: the longest an event stays outside every
// checkpoint, and so the window in which an edit of it in SQL goes unnoticed.
const CheckpointEvery = 5 * time.Second

// publishBatch bounds the events one checkpoint adds, so that a long backlog (audit enabled on
// an old log) is published in steps of bounded transactions.
const publishBatch = 100_000

// publisherLock is the advisory lock one publisher at a time holds, for its transaction.
const publisherLock = 0x636f6d7075746502 // "compute" 2

// Publish extends the tree from the last checkpoint with the events sequenced since, at most
// publishBatch of them, and publishes a signed checkpoint of the new size. It returns the
// checkpoint, or nil when the log has not grown or another process's publisher holds the lock,
// and whether more events wait. A gap in the log is ErrGap, and nothing is published past it.
func Publish(ctx context.Context, db *postgres.DB, k *Key) (*api.Checkpoint, bool, error) {
	var cp *api.Checkpoint
	var more bool
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(publisherLock)).Scan(&mine); err != nil || !mine {
			return err
		}
		var size int64
		var hashes [][]byte
		err := tx.QueryRow(ctx, `SELECT size, range_hashes FROM compute.audit_checkpoints ORDER BY size DESC LIMIT 1`).Scan(&size, &hashes)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("audit: read the last checkpoint: %w", err)
		}
		r, err := ranges.NewRange(0, uint64(size), hashes)
		if err != nil {
			return fmt.Errorf("audit: the last checkpoint's state (size %d): %w", size, err)
		}
		n, err := scan(ctx, tx, uint64(size), publishBatch, func(_ uint64, leaf []byte) error {
			return r.Append(hasher.HashLeaf(leaf), nil)
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		more = n == publishBatch
		root, err := r.GetRootHash(nil)
		if err != nil {
			return fmt.Errorf("audit: %w", err)
		}
		var at time.Time
		if err := tx.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&at); err != nil {
			return fmt.Errorf("audit: read the clock: %w", err)
		}
		at = at.UTC()
		signed, err := k.Sign(r.End(), root, at)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO compute.audit_checkpoints (size, root, range_hashes, note, verifier_key, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, int64(r.End()), root, r.Hashes(), signed, k.verifier, at); err != nil {
			return fmt.Errorf("audit: publish checkpoint %d: %w", r.End(), err)
		}
		cp = &api.Checkpoint{Origin: k.origin, Size: int64(r.End()), RootHash: root, CreatedAt: at, Note: signed, VerifierKey: k.verifier}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return cp, more, nil
}

// ErrNoCheckpoint is Latest's answer before the first checkpoint is published.
var ErrNoCheckpoint = errors.New("audit: no checkpoint has been published yet")

// Latest reads the last checkpoint published.
func Latest(ctx context.Context, q postgres.Querier) (api.Checkpoint, error) {
	var cp api.Checkpoint
	var at time.Time
	err := q.QueryRow(ctx, `SELECT size, root, note, verifier_key, created_at FROM compute.audit_checkpoints ORDER BY size DESC LIMIT 1`).
		Scan(&cp.Size, &cp.RootHash, &cp.Note, &cp.VerifierKey, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Checkpoint{}, ErrNoCheckpoint
	}
	if err != nil {
		return api.Checkpoint{}, fmt.Errorf("audit: read the latest checkpoint: %w", err)
	}
	cp.CreatedAt = at.UTC()
	cp.Origin, _, _ = strings.Cut(cp.VerifierKey, "+")
	return cp, nil
}
