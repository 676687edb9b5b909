package api

import "time"

// ResourceAudit is the IAM resource type of the event log's audit tree.
const ResourceAudit = "compute-audit"

// The audit group: the event log as a Merkle tree, its signed checkpoints and proofs (see
// docs/events.md, "Audit"). Only callers in the root tenant may use it: the tree spans every
// tenant's events.
var (
	AuditCheckpoint = NewMethod[GetCheckpoint, Checkpoint]("audit", "checkpoint", false, ResourceAudit, "v0.2",
		"The latest signed checkpoint of the event log's Merkle tree: its size, root hash and time, and the key that signed it.")
	AuditProveInclusion = NewMethod[ProveInclusion, InclusionProof]("audit", "proveInclusion", false, ResourceAudit, "v0.2",
		"Prove, from the live log, that an event is a leaf of the tree of a size.")
	AuditProveConsistency = NewMethod[ProveConsistency, ConsistencyProof]("audit", "proveConsistency", false, ResourceAudit, "v0.2",
		"Prove, from the live log, that the tree of one size is a prefix of the tree of a larger size.")
)

// AuditMethods returns the audit group.
func AuditMethods() []MethodInfo { return infos(auditTable()) }

func auditTable() []Describer {
	return []Describer{AuditCheckpoint, AuditProveInclusion, AuditProveConsistency}
}

// Checkpoint is a signed statement of the event log's Merkle tree: the tree of events 1..Size
// has root RootHash. Note is the statement itself (a C2SP checkpoint, a signed note of
// golang.org/x/mod/sumdb/note), which VerifierKey verifies; the other fields repeat what it says.
// Save one, and a later audit verify proves that the log still holds those events unchanged.
type Checkpoint struct {
	Origin      string    `json:"origin"`      // the log's name, the note's first line
	Size        int64     `json:"size"`        // the events it covers: ids 1..Size
	RootHash    []byte    `json:"rootHash"`    // RFC 6962 root of their leaves (base64 in JSON)
	CreatedAt   time.Time `json:"createdAt"`   // when it was published
	Note        string    `json:"note"`        // the signed note
	VerifierKey string    `json:"verifierKey"` // the note verifier key that signed it
}

// GetCheckpoint is the input of audit.checkpoint: it has no fields.
type GetCheckpoint struct{}

// Validate implements the input check.
func (GetCheckpoint) Validate() error { return nil }

// ProveInclusion is the input of audit.proveInclusion: event Seq (an event id) in the tree of
// Size events, by default the latest checkpoint's.
type ProveInclusion struct {
	Seq  int64 `json:"seq" input:"int8"`
	Size int64 `json:"size,omitempty" input:"int8"`
}

// Validate implements the input check.
func (in ProveInclusion) Validate() error {
	switch {
	case in.Seq < 1:
		return InvalidField("seq", "must be an event id (≥ 1), got %d", in.Seq)
	case in.Size < 0:
		return InvalidField("size", "must be a tree size (≥ 1), or 0 for the latest checkpoint's, got %d", in.Size)
	case in.Size != 0 && in.Size < in.Seq:
		return InvalidField("size", "%d is smaller than seq %d: the tree of %d events does not hold event %d", in.Size, in.Seq, in.Size, in.Seq)
	}
	return nil
}

// InclusionProof proves that Leaf, the event Seq as the log holds it now, is leaf LeafIndex
// (Seq-1) of the tree of Size events. Hashes is the RFC 6962 audit path, lowest first;
// LeafHash is SHA-256(0x00 || Leaf). docs/events.md gives Leaf's encoding.
type InclusionProof struct {
	Seq       int64    `json:"seq"`
	Size      int64    `json:"size"`
	LeafIndex int64    `json:"leafIndex"`
	Leaf      []byte   `json:"leaf"`
	LeafHash  []byte   `json:"leafHash"`
	Hashes    [][]byte `json:"hashes"`
}

// ProveConsistency is the input of audit.proveConsistency: from the tree of From events to the
// tree of To events, by default the latest checkpoint's size.
type ProveConsistency struct {
	From int64 `json:"from" input:"int8"`
	To   int64 `json:"to,omitempty" input:"int8"`
}

// Validate implements the input check.
func (in ProveConsistency) Validate() error {
	switch {
	case in.From < 1:
		return InvalidField("from", "must be a tree size (≥ 1), got %d", in.From)
	case in.To < 0:
		return InvalidField("to", "must be a tree size (≥ from), or 0 for the latest checkpoint's, got %d", in.To)
	case in.To != 0 && in.To < in.From:
		return InvalidField("to", "%d is smaller than from %d: a tree only grows", in.To, in.From)
	}
	return nil
}

// ConsistencyProof proves that the tree of From events is a prefix of the tree of To events:
// the RFC 6962 consistency proof, computed from the live log.
type ConsistencyProof struct {
	From   int64    `json:"from"`
	To     int64    `json:"to"`
	Hashes [][]byte `json:"hashes"`
}
