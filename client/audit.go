package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/better-compute/compute/api"
)

// ErrAuditFailed marks a failed audit verification: a checkpoint whose signature or statements
// do not hold, or an event log that no longer matches a checkpoint it was signed in.
var ErrAuditFailed = errors.New("audit verification failed")

// SignedCheckpoint is what a checkpoint's note states, once its signature is verified.
type SignedCheckpoint struct {
	Origin string
	Size   uint64
	Root   []byte
	Time   time.Time // the note's "time" line; zero when it has none
}

func failed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrAuditFailed, fmt.Sprintf(format, args...))
}

// OpenCheckpoint verifies cp's note with verifierKey (cp.VerifierKey when empty) and returns
// what it states. It fails, with ErrAuditFailed, when the signature does not verify, the note
// is not a checkpoint, or cp's other fields say something the note does not.
func OpenCheckpoint(cp api.Checkpoint, verifierKey string) (SignedCheckpoint, error) {
	return openCheckpoint(cp, verifierKey, "the checkpoint")
}

// openCheckpoint is OpenCheckpoint, its errors naming the checkpoint as name.
func openCheckpoint(cp api.Checkpoint, verifierKey, name string) (SignedCheckpoint, error) {
	if verifierKey == "" {
		verifierKey = cp.VerifierKey
	}
	v, err := note.NewVerifier(verifierKey)
	if err != nil {
		return SignedCheckpoint{}, failed("%s: the verifier key %q: %v", name, verifierKey, err)
	}
	n, err := note.Open([]byte(cp.Note), note.VerifierList(v))
	var unverified *note.UnverifiedNoteError
	var invalid *note.InvalidSignatureError
	switch {
	case errors.As(err, &unverified):
		var by []string
		for _, s := range unverified.Note.UnverifiedSigs {
			by = append(by, fmt.Sprintf("%s+%08x", s.Name, s.Hash))
		}
		return SignedCheckpoint{}, failed("%s is not signed by key %s+%08x but by %s: another log's, or the secret changed", name, v.Name(), v.KeyHash(), strings.Join(by, ", "))
	case errors.As(err, &invalid):
		return SignedCheckpoint{}, failed("%s's signature by %s does not verify: its text was changed after it was signed", name, v.Name())
	case err != nil:
		return SignedCheckpoint{}, failed("%s's note: %v", name, err)
	}
	s, err := parseCheckpoint(n.Text)
	if err != nil {
		return SignedCheckpoint{}, failed("%s's note: %v", name, err)
	}
	switch {
	case s.Origin != v.Name():
		return SignedCheckpoint{}, failed("%s is of log %q, but its key is %q's", name, s.Origin, v.Name())
	case cp.Size != 0 && uint64(cp.Size) != s.Size:
		return SignedCheckpoint{}, failed("%s says size %d, but its signed note says %d", name, cp.Size, s.Size)
	case cp.RootHash != nil && !bytes.Equal(cp.RootHash, s.Root):
		return SignedCheckpoint{}, failed("%s's rootHash is not its signed note's", name)
	}
	return s, nil
}

// parseCheckpoint reads a checkpoint's text: origin, size and base64 root hash lines, then
// extension lines, of which "time <RFC 3339>" is read.
func parseCheckpoint(text string) (SignedCheckpoint, error) {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) < 3 {
		return SignedCheckpoint{}, errors.New("not a checkpoint: fewer than three lines")
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		return SignedCheckpoint{}, fmt.Errorf("not a checkpoint: size %q", lines[1])
	}
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != sha256.Size {
		return SignedCheckpoint{}, fmt.Errorf("not a checkpoint: root hash %q", lines[2])
	}
	s := SignedCheckpoint{Origin: lines[0], Size: size, Root: root}
	for _, l := range lines[3:] {
		if v, ok := strings.CutPrefix(l, "time "); ok {
			if s.Time, err = time.Parse(time.RFC3339Nano, v); err != nil {
				return SignedCheckpoint{}, fmt.Errorf("the time line %q: %w", l, err)
			}
		}
	}
	return s, nil
}

// CheckConsistency verifies p, a consistency proof, between two checkpoints: the tree of
// saved's size is a prefix of the tree of latest's.
func CheckConsistency(saved, latest SignedCheckpoint, p api.ConsistencyProof) error {
	if uint64(p.From) != saved.Size || uint64(p.To) != latest.Size {
		return failed("the consistency proof is from %d to %d, not from %d to %d", p.From, p.To, saved.Size, latest.Size)
	}
	if saved.Size == latest.Size && !bytes.Equal(saved.Root, latest.Root) {
		return failed("the latest checkpoint covers the same %d events as the saved one but has another root: "+
			"the log was rewritten and the tree re-signed (were rows of compute.audit_checkpoints deleted?)", saved.Size)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, saved.Size, latest.Size, p.Hashes, saved.Root, latest.Root); err != nil {
		return failed("the live event log is not consistent with the saved checkpoint of events 1..%d (%v): "+
			"an event with an id up to %d was edited, deleted or reordered after it was signed", saved.Size, proofError(err), latest.Size)
	}
	return nil
}

// CheckInclusion verifies p: its leaf, the event as the log holds it now, is leaf p.LeafIndex
// of cp's tree.
func CheckInclusion(cp SignedCheckpoint, p api.InclusionProof) error {
	if err := checkInclusion(cp, p); err != nil {
		return failed("event %d as the log holds it now is not in the checkpoint of events 1..%d: %v", p.Seq, cp.Size, err)
	}
	return nil
}

func checkInclusion(cp SignedCheckpoint, p api.InclusionProof) error {
	if uint64(p.Size) != cp.Size || p.LeafIndex != p.Seq-1 || p.Seq < 1 {
		return fmt.Errorf("the proof is of event %d (leaf %d) in the tree of %d, not in the checkpoint's", p.Seq, p.LeafIndex, p.Size)
	}
	hash := rfc6962.DefaultHasher.HashLeaf(p.Leaf)
	if !bytes.Equal(hash, p.LeafHash) {
		return errors.New("the proof's leafHash is not the hash of its leaf")
	}
	return proofError(proof.VerifyInclusion(rfc6962.DefaultHasher, uint64(p.LeafIndex), cp.Size, hash, p.Hashes, cp.Root))
}

// proofError words the merkle library's root mismatch on one line, in hex.
func proofError(err error) error {
	var rm proof.RootMismatchError
	if errors.As(err, &rm) {
		return fmt.Errorf("the proof gives root %x, the checkpoint says %x", rm.CalculatedRoot, rm.ExpectedRoot)
	}
	return err
}

// VerifyCheckpoint checks a saved checkpoint against the live event log, with verifierKey
// (saved.VerifierKey when empty): both the saved checkpoint and the control plane's latest
// are signed by that key, the latest extends the saved one (a consistency proof), and the
// events the log holds now hash to the latest's root (the inclusion proof of its last event,
// whose audit path covers every event before it). It returns the latest checkpoint, which can
// be saved for the next verification. Every failure wraps ErrAuditFailed, and says what is
// wrong; an error without it is a failure to ask (the network, a key without the right).
func (c *Client) VerifyCheckpoint(ctx context.Context, saved api.Checkpoint, verifierKey string) (api.Checkpoint, error) {
	if verifierKey == "" {
		verifierKey = saved.VerifierKey
	}
	s, err := openCheckpoint(saved, verifierKey, "the saved checkpoint")
	if err != nil {
		return api.Checkpoint{}, err
	}
	latest, err := c.Audit.Checkpoint(ctx, api.GetCheckpoint{})
	if err != nil {
		return api.Checkpoint{}, logAnswer(err, "read the latest checkpoint")
	}
	l, err := openCheckpoint(latest, verifierKey, "the control plane's latest checkpoint")
	if err != nil {
		return api.Checkpoint{}, err
	}
	if l.Size < s.Size {
		return api.Checkpoint{}, failed("the control plane's latest checkpoint covers %d events, fewer than the saved checkpoint's %d: "+
			"checkpoints were removed from compute.audit_checkpoints, or the log was cut", l.Size, s.Size)
	}
	cons, err := c.Audit.ProveConsistency(ctx, api.ProveConsistency{From: int64(s.Size), To: int64(l.Size)})
	if err != nil {
		return api.Checkpoint{}, logAnswer(err, fmt.Sprintf("prove events 1..%d consistent with 1..%d", s.Size, l.Size))
	}
	if err := CheckConsistency(s, l, cons); err != nil {
		return api.Checkpoint{}, err
	}
	incl, err := c.Audit.ProveInclusion(ctx, api.ProveInclusion{Seq: int64(l.Size), Size: int64(l.Size)})
	if err != nil {
		return api.Checkpoint{}, logAnswer(err, fmt.Sprintf("prove event %d in the tree of %d", l.Size, l.Size))
	}
	// The audit path of the last event is the roots of the subtrees left of it, so it covers the
	// whole log: a change anywhere moves the root it proves.
	if err := checkInclusion(l, incl); err != nil {
		return api.Checkpoint{}, failed("the event log as it is now does not hash to the root of the latest checkpoint (events 1..%d, published %s): "+
			"an event with an id up to %d was edited, deleted or reordered after it was signed (%v)", l.Size, l.Time.Format(time.RFC3339), l.Size, err)
	}
	return latest, nil
}

// VerifyEvent checks that e, an event as events.list or the stream gave it, is in cp's tree
// (cp verified with verifierKey, cp.VerifierKey when empty), exactly as it was read: the proof's
// leaf is decoded and compared with e field by field.
func (c *Client) VerifyEvent(ctx context.Context, cp api.Checkpoint, verifierKey string, e api.Event) error {
	s, err := OpenCheckpoint(cp, verifierKey)
	if err != nil {
		return err
	}
	if e.ID < 1 || uint64(e.ID) > s.Size {
		return fmt.Errorf("client: event %d is not among the checkpoint's events 1..%d", e.ID, s.Size)
	}
	p, err := c.Audit.ProveInclusion(ctx, api.ProveInclusion{Seq: e.ID, Size: int64(s.Size)})
	if err != nil {
		return logAnswer(err, fmt.Sprintf("prove event %d in the tree of %d", e.ID, s.Size))
	}
	if err := CheckInclusion(s, p); err != nil {
		return err
	}
	held, err := DecodeLeaf(p.Leaf)
	if err != nil {
		return failed("event %d's leaf: %v", e.ID, err)
	}
	if err := sameEvent(held, e); err != nil {
		return failed("event %d is in the checkpoint, but not as given: %v", e.ID, err)
	}
	return nil
}

// logAnswer wraps an API answer to a verification's question: failed_precondition (the log
// has a gap, or is shorter than a checkpoint) is a failed verification; others are not.
func logAnswer(err error, what string) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code == api.CodeFailedPrecondition {
		return fmt.Errorf("%w: the control plane cannot %s: %w", ErrAuditFailed, what, err)
	}
	return fmt.Errorf("client: %s: %w", what, err)
}

// DecodeLeaf reads a leaf of the audit tree (its encoding is in docs/events.md, "Audit") back
// into the event it encodes. Data is the jsonb text PostgreSQL printed, decoded.
func DecodeLeaf(leaf []byte) (api.Event, error) {
	if len(leaf) < 1+8 || leaf[0] != 1 { // the encoding's version
		return api.Event{}, errors.New("not a version 1 leaf")
	}
	e := api.Event{ID: int64(binary.BigEndian.Uint64(leaf[1:9]))}
	rest := leaf[9:]
	str := func() (string, error) {
		if len(rest) < 4 || uint64(len(rest)-4) < uint64(binary.BigEndian.Uint32(rest)) {
			return "", errors.New("truncated")
		}
		end := 4 + int(binary.BigEndian.Uint32(rest))
		s := string(rest[4:end])
		rest = rest[end:]
		return s, nil
	}
	var err error
	for _, f := range []*string{&e.Type, &e.TenantID, &e.Subject} {
		if *f, err = str(); err != nil {
			return api.Event{}, err
		}
	}
	if len(rest) < 8 {
		return api.Event{}, errors.New("truncated")
	}
	e.CreatedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(rest))).UTC()
	rest = rest[8:]
	data, err := str()
	if err != nil {
		return api.Event{}, err
	}
	if len(rest) != 0 {
		return api.Event{}, errors.New("bytes after the data")
	}
	if err := json.Unmarshal([]byte(data), &e.Data); err != nil {
		return api.Event{}, fmt.Errorf("data: %w", err)
	}
	return e, nil
}

// sameEvent compares an event from a leaf with one from the API.
func sameEvent(held, e api.Event) error {
	switch {
	case held.ID != e.ID:
		return fmt.Errorf("its id is %d", held.ID)
	case held.Type != e.Type:
		return fmt.Errorf("its type is %q, not %q", held.Type, e.Type)
	case held.TenantID != e.TenantID:
		return fmt.Errorf("its tenant is %q, not %q", held.TenantID, e.TenantID)
	case held.Subject != e.Subject:
		return fmt.Errorf("its subject is %q, not %q", held.Subject, e.Subject)
	case held.CreatedAt.UnixMicro() != e.CreatedAt.UnixMicro():
		return fmt.Errorf("it was created at %s, not %s", held.CreatedAt.Format(time.RFC3339Nano), e.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	// Compare data as JSON values: e's went through Go's encoding, the leaf's is PostgreSQL's.
	b, err := json.Marshal(e.Data)
	if err != nil {
		return err
	}
	var given map[string]any
	if err := json.Unmarshal(b, &given); err != nil {
		return err
	}
	if given == nil {
		given = map[string]any{}
	}
	if held.Data == nil {
		held.Data = map[string]any{}
	}
	if !reflect.DeepEqual(held.Data, given) {
		h, _ := json.Marshal(held.Data)
		return fmt.Errorf("its data is %s, not %s", h, b)
	}
	return nil
}
