package audit

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/better-compute/compute/postgres"
)

// hasher is the tree's: RFC 6962 over SHA-256 (leaves SHA-256(0x00 || leaf), nodes
// SHA-256(0x01 || left || right)).
var hasher = rfc6962.DefaultHasher

// ranges builds the compact ranges the publisher extends and proofs are computed with.
var ranges = &compact.RangeFactory{Hash: hasher.HashChildren}

// LeafVersion is the first byte of every leaf: the version of the encoding below.
const LeafVersion = 1

// ErrGap marks an event log that is not 1, 2, 3, … with no gap: a row of compute.events was
// deleted, or its seq changed, after it was sequenced. No tree can be built over it.
var ErrGap = errors.New("audit: the event log has a gap")

// Leaf is the canonical encoding of an event as the log holds it, the bytes its leaf hash is
// taken of (docs/events.md, "Audit"):
//
//	0x01 || u64(seq) || str(type) || str(tenant_id) || str(subject) || i64(created_at) || str(data)
//
// where integers are big-endian, str(s) is u32(len(s)) || s, created_at counts microseconds
// since 1970-01-01T00:00:00Z, and data is the jsonb as PostgreSQL prints it (data::text).
func Leaf(seq int64, typ, tenant, subject string, createdAt time.Time, data string) []byte {
	b := make([]byte, 0, 1+8+4*4+8+len(typ)+len(tenant)+len(subject)+len(data))
	b = append(b, LeafVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	for _, s := range []string{typ, tenant, subject} {
		b = appendString(b, s)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(createdAt.UnixMicro()))
	return appendString(b, data)
}

func appendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}

// LeafHash is the RFC 6962 hash of a leaf.
func LeafHash(leaf []byte) []byte { return hasher.HashLeaf(leaf) }

// scan reads the leaves of the events after seq from, in log order, at most limit of them, and
// hands each to fn with its index (seq-1). It returns how many it read, and fails with ErrGap
// when the ids do not follow on from from with no gap.
func scan(ctx context.Context, q postgres.Querier, from, limit uint64, fn func(index uint64, leaf []byte) error) (uint64, error) {
	rows, err := q.Query(ctx, `SELECT seq, type, tenant_id, subject, created_at, data::text FROM compute.events
		WHERE seq > $1 ORDER BY seq LIMIT $2`, int64(from), int64(limit))
	if err != nil {
		return 0, fmt.Errorf("audit: read the event log: %w", err)
	}
	defer rows.Close()
	n := uint64(0)
	var (
		seq                        int64
		typ, tenant, subject, data string
		at                         time.Time
	)
	for rows.Next() {
		if err := rows.Scan(&seq, &typ, &tenant, &subject, &at, &data); err != nil {
			return n, fmt.Errorf("audit: read the event log: %w", err)
		}
		want := from + n + 1
		if uint64(seq) != want {
			return n, fmt.Errorf("%w: there is no event %d (the next is %d): a row of compute.events was deleted or its seq changed", ErrGap, want, seq)
		}
		if err := fn(want-1, Leaf(seq, typ, tenant, subject, at, data)); err != nil {
			return n, err
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("audit: read the event log: %w", err)
	}
	return n, nil
}

// lastSeq is the id of the last event sequenced.
func lastSeq(ctx context.Context, q postgres.Querier) (uint64, error) {
	var last int64
	if err := q.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM compute.events`).Scan(&last); err != nil {
		return 0, fmt.Errorf("audit: read the event log: %w", err)
	}
	return uint64(last), nil
}

// ErrShort marks a tree size beyond the events the log holds.
var ErrShort = errors.New("audit: the event log is shorter than the tree asked for")

// nodeHashes computes the hashes of nodes ids of the tree of size events from the live log, in
// one pass over events 1..size, and the leaf at index at (none when at ≥ size). The nodes must
// not overlap, as those of one proof do not.
func nodeHashes(ctx context.Context, q postgres.Querier, size uint64, ids []compact.NodeID, at uint64) ([][]byte, []byte, error) {
	last, err := lastSeq(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	if last < size {
		// Checked before the scan, so that a size far past the log costs one index lookup.
		return nil, nil, fmt.Errorf("%w: it holds events up to %d, not %d", ErrShort, last, size)
	}
	type span struct {
		begin, end uint64
		out        int
		r          *compact.Range
	}
	spans := make([]span, len(ids))
	for i, id := range ids {
		b, e := id.Coverage()
		if e > size {
			return nil, nil, fmt.Errorf("audit: node %+v lies outside the tree of %d", id, size)
		}
		spans[i] = span{b, e, i, ranges.NewEmptyRange(b)}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.begin, b.begin) })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, nil, fmt.Errorf("audit: proof nodes overlap")
		}
	}
	if len(spans) == 0 && at >= size {
		return [][]byte{}, nil, nil // nothing to compute: a proof between equal sizes
	}
	var leaf []byte
	p := 0
	n, err := scan(ctx, q, 0, size, func(i uint64, l []byte) error {
		if i == at {
			leaf = l
		}
		for p < len(spans) && spans[p].end <= i {
			p++
		}
		if p < len(spans) && spans[p].begin <= i {
			return spans[p].r.Append(hasher.HashLeaf(l), nil)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if n < size {
		return nil, nil, fmt.Errorf("%w: it ends at event %d, not %d", ErrShort, n, size)
	}
	hashes := make([][]byte, len(ids))
	for _, s := range spans {
		h := s.r.Hashes()
		if len(h) != 1 {
			return nil, nil, fmt.Errorf("audit: node [%d, %d) is not a perfect subtree", s.begin, s.end)
		}
		hashes[s.out] = h[0]
	}
	return hashes, leaf, nil
}

// Inclusion proves, from the live log, that event seq is leaf seq-1 of the tree of size events:
// it returns the event's leaf and the audit path.
func Inclusion(ctx context.Context, q postgres.Querier, seq, size uint64) (leaf []byte, path [][]byte, err error) {
	if seq < 1 || seq > size {
		return nil, nil, fmt.Errorf("audit: event %d is not in the tree of %d", seq, size)
	}
	nodes, err := proof.Inclusion(seq-1, size)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	hashes, leaf, err := nodeHashes(ctx, q, size, nodes.IDs, seq-1)
	if err != nil {
		return nil, nil, err
	}
	path, err = nodes.Rehash(hashes, hasher.HashChildren)
	if err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	return leaf, path, nil
}

// Consistency proves, from the live log, that the tree of from events is a prefix of the tree
// of to events.
func Consistency(ctx context.Context, q postgres.Querier, from, to uint64) ([][]byte, error) {
	nodes, err := proof.Consistency(from, to)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	hashes, _, err := nodeHashes(ctx, q, to, nodes.IDs, to)
	if err != nil {
		return nil, err
	}
	p, err := nodes.Rehash(hashes, hasher.HashChildren)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return p, nil
}

// Root computes, from the live log, the root of the tree of its first size events.
func Root(ctx context.Context, q postgres.Querier, size uint64) ([]byte, error) {
	r := ranges.NewEmptyRange(0)
	n, err := scan(ctx, q, 0, size, func(_ uint64, leaf []byte) error { return r.Append(hasher.HashLeaf(leaf), nil) })
	if err != nil {
		return nil, err
	}
	if n < size {
		return nil, fmt.Errorf("%w: it ends at event %d, not %d", ErrShort, n, size)
	}
	if size == 0 {
		return hasher.EmptyRoot(), nil
	}
	return r.GetRootHash(nil)
}
