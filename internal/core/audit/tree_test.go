package audit_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"math/bits"
	"testing"
	"time"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"github.com/transparency-dev/merkle/testonly"
	"pgregory.net/rapid"

	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/audit"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var hasher = rfc6962.DefaultHasher

// emit writes n events of assorted tenants and data and sequences them.
func emit(t testing.TB, db *postgres.DB, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		data := map[string]any{"i": i, "name": fmt.Sprintf("n-%d", i), "nested": map[string]any{"b": 1, "a": []any{"x", i}}}
		if err := events.Emit(ctx, db.Pool, "node.online", []string{"root", "t1", "t2"}[i%3], fmt.Sprintf("node-%d", i), data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := events.Sequence(ctx, db); err != nil {
		t.Fatal(err)
	}
}

// liveLeaves reads every sequenced event's leaf with a query of the test's own.
func liveLeaves(t testing.TB, db *postgres.DB) [][]byte {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT seq, type, tenant_id, subject, created_at, data::text FROM compute.events WHERE seq IS NOT NULL ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var seq int64
		var typ, tenant, subject, data string
		var at time.Time
		if err := rows.Scan(&seq, &typ, &tenant, &subject, &at, &data); err != nil {
			t.Fatal(err)
		}
		out = append(out, audit.Leaf(seq, typ, tenant, subject, at, data))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// mth is RFC 6962's Merkle Tree Hash, §2.1, written from its definition: the split is at the
// largest power of two smaller than n.
func mth(leaves [][]byte) []byte {
	switch n := len(leaves); n {
	case 0:
		return hasher.EmptyRoot()
	case 1:
		return hasher.HashLeaf(leaves[0])
	default:
		k := 1 << (bits.Len(uint(n-1)) - 1)
		return hasher.HashChildren(mth(leaves[:k]), mth(leaves[k:]))
	}
}

// TestLeafEncoding pins the leaf of one event byte for byte, as docs/events.md describes it.
func TestLeafEncoding(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.FixedZone("x", 3600))
	got := audit.Leaf(7, "node.online", "root", "n1", at, `{"a": 1}`)
	want := "01" + "0000000000000007" +
		"0000000b" + hex.EncodeToString([]byte("node.online")) +
		"00000004" + hex.EncodeToString([]byte("root")) +
		"00000002" + hex.EncodeToString([]byte("n1")) +
		fmt.Sprintf("%016x", at.UnixMicro()) +
		"00000008" + hex.EncodeToString([]byte(`{"a": 1}`))
	if hex.EncodeToString(got) != want {
		t.Fatalf("leaf = %x\nwant   %s", got, want)
	}
	e, err := client.DecodeLeaf(got)
	if err != nil || e.ID != 7 || e.Type != "node.online" || e.TenantID != "root" || e.Subject != "n1" ||
		!e.CreatedAt.Equal(at) || e.Data["a"] != float64(1) {
		t.Fatalf("DecodeLeaf = %+v, %v", e, err)
	}
	for _, bad := range [][]byte{got[:len(got)-1], append(append([]byte{}, got...), 0), append([]byte{2}, got[1:]...), got[:5]} {
		if _, err := client.DecodeLeaf(bad); err == nil {
			t.Errorf("DecodeLeaf(%x) decoded", bad)
		}
	}
}

// TestTreeMatchesReference: for logs of several sizes, the root of every prefix, every
// inclusion proof and every consistency proof computed from the live rows is the merkle
// library's in-memory tree's, verifies, and the root is RFC 6962's Merkle Tree Hash.
func TestTreeMatchesReference(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	q := env.DB.Pool
	total := 0
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33} {
		emit(t, env.DB, n-total)
		total = n
		leaves := liveLeaves(t, env.DB)
		if len(leaves) != n {
			t.Fatalf("%d leaves, want %d", len(leaves), n)
		}
		ref := testonly.New(hasher)
		ref.AppendData(leaves...)
		for size := uint64(1); size <= uint64(n); size++ {
			root, err := audit.Root(ctx, q, size)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(root, ref.HashAt(size)) || !bytes.Equal(root, mth(leaves[:size])) {
				t.Fatalf("root of %d = %x, want %x (MTH %x)", size, root, ref.HashAt(size), mth(leaves[:size]))
			}
		}
		size := uint64(n)
		root := ref.Hash()
		for seq := uint64(1); seq <= size; seq++ {
			leaf, path, err := audit.Inclusion(ctx, q, seq, size)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := ref.InclusionProof(seq-1, size)
			if !bytes.Equal(leaf, leaves[seq-1]) || !equalHashes(path, want) {
				t.Fatalf("inclusion of %d in %d: %x, want %x", seq, size, path, want)
			}
			if err := proof.VerifyInclusion(hasher, seq-1, size, hasher.HashLeaf(leaf), path, root); err != nil {
				t.Fatalf("inclusion of %d in %d: %v", seq, size, err)
			}
		}
		for from := uint64(1); from <= size; from++ {
			p, err := audit.Consistency(ctx, q, from, size)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := ref.ConsistencyProof(from, size)
			if !equalHashes(p, want) {
				t.Fatalf("consistency %d→%d: %x, want %x", from, size, p, want)
			}
			if err := proof.VerifyConsistency(hasher, from, size, p, ref.HashAt(from), root); err != nil {
				t.Fatalf("consistency %d→%d: %v", from, size, err)
			}
		}
	}
}

func equalHashes(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// TestPublishedTreeGrowsLikeTheReference: checkpoints published as the log grows in steps of
// random sizes (the publisher extending its stored compact range, never rereading old events)
// have the reference tree's root at their size, and random proofs from the live rows verify
// against them.
func TestPublishedTreeGrowsLikeTheReference(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	key, err := audit.NewKey(computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	ref := testonly.New(hasher)
	var published []uint64
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 40).Draw(rt, "events")
		emit(t, env.DB, n)
		ref = testonly.New(hasher)
		ref.AppendData(liveLeaves(t, env.DB)...)
		cp, _, err := audit.Publish(ctx, env.DB, key)
		if err != nil {
			rt.Fatal(err)
		}
		if n == 0 {
			if cp != nil {
				rt.Fatalf("a checkpoint of %d published with no new event", cp.Size)
			}
			return
		}
		if cp == nil || uint64(cp.Size) != ref.Size() || !bytes.Equal(cp.RootHash, ref.Hash()) {
			rt.Fatalf("checkpoint %+v, want size %d root %x", cp, ref.Size(), ref.Hash())
		}
		published = append(published, uint64(cp.Size))
		size := uint64(cp.Size)
		seq := rapid.Uint64Range(1, size).Draw(rt, "seq")
		leaf, path, err := audit.Inclusion(ctx, env.DB.Pool, seq, size)
		if err != nil {
			rt.Fatal(err)
		}
		if err := proof.VerifyInclusion(hasher, seq-1, size, hasher.HashLeaf(leaf), path, cp.RootHash); err != nil {
			rt.Fatalf("inclusion of %d in checkpoint %d: %v", seq, size, err)
		}
		from := rapid.SampledFrom(published).Draw(rt, "from")
		p, err := audit.Consistency(ctx, env.DB.Pool, from, size)
		if err != nil {
			rt.Fatal(err)
		}
		if err := proof.VerifyConsistency(hasher, from, size, p, ref.HashAt(from), cp.RootHash); err != nil {
			rt.Fatalf("consistency %d→%d: %v", from, size, err)
		}
	})
}
