package api_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/better-compute/compute/api"
)

// FuzzDecodeCursor: any string is either refused as invalid_argument naming the cursor, or
// decodes to a key the database can compare (UTF-8 text without control characters) that
// encodes back to a cursor decoding to the same key.
func FuzzDecodeCursor(f *testing.F) {
	for _, s := range []string{"", "q1:", "q1:abc", "q1:\x00", "q1:\xff", "r1:0190a0b0-0000-7000-8000-000000000001", "v1:x\n", "q2:abc", "q1"} {
		f.Add(base64.RawURLEncoding.EncodeToString([]byte(s)))
	}
	f.Add("%%%")
	f.Add("cTE6YWJj=")
	f.Add("cTE6YWJj\n")
	f.Fuzz(func(t *testing.T, cursor string) {
		key, err := api.DecodeCursor("q1", cursor)
		if err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "cursor" {
				t.Fatalf("DecodeCursor(%q) = %v, want invalid_argument on the cursor field", cursor, err)
			}
			return
		}
		if !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
			t.Fatalf("DecodeCursor(%q) = %q, which is not text the database can compare", cursor, key)
		}
		again, err := api.DecodeCursor("q1", api.EncodeCursor("q1", key))
		if err != nil || again != key {
			t.Fatalf("round trip of %q = %q, %v", key, again, err)
		}
	})
}

// FuzzCursorRoundTrip: every key that is text survives EncodeCursor then DecodeCursor, and a
// cursor of another kind is refused.
func FuzzCursorRoundTrip(f *testing.F) {
	f.Add("0190a0b0-0000-7000-8000-000000000001")
	f.Add("pool/gpus/h100")
	f.Add("")
	f.Add("ü:ß/∞")
	f.Fuzz(func(t *testing.T, key string) {
		if !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
			t.Skip("not text")
		}
		got, err := api.DecodeCursor("q1", api.EncodeCursor("q1", key))
		if err != nil || got != key {
			t.Fatalf("round trip of %q = %q, %v", key, got, err)
		}
		if _, err := api.DecodeCursor("r1", api.EncodeCursor("q1", key)); err == nil {
			t.Fatalf("a q1 cursor of %q decoded as an r1 cursor", key)
		}
	})
}

// TestPageOfCutsAtTheLimitWithACursorAfterTheLast: limit+1 rows make a page of limit and a
// cursor resuming after the last one kept; fewer make the last page; none an empty one.
func TestPageOfCutsAtTheLimitWithACursorAfterTheLast(t *testing.T) {
	key := func(s string) string { return s }
	p := api.PageOf([]string{"a", "b", "c"}, 2, "t1", key)
	if len(p.Items) != 2 || p.Items[1] != "b" {
		t.Fatalf("items %v", p.Items)
	}
	if k, err := api.DecodeCursor("t1", p.NextCursor); err != nil || k != "b" {
		t.Errorf("cursor resumes after %q (%v), want b", k, err)
	}
	if p := api.PageOf([]string{"a"}, 2, "t1", key); p.NextCursor != "" || len(p.Items) != 1 {
		t.Errorf("a short page: %+v", p)
	}
	if p := api.PageOf[string](nil, 2, "t1", key); p.Items == nil || len(p.Items) != 0 || p.NextCursor != "" {
		t.Errorf("no rows: %+v, want an empty list (never null)", p)
	}
}

// FuzzDecodeIDCursor: an id cursor's key is only ever a UUID in its canonical form, which the
// database's uuid type reads: a key the uuid package accepts in another form ("urn:uuid:…",
// braces, no hyphens) is not passed on as written for a query to fail casting it.
func FuzzDecodeIDCursor(f *testing.F) {
	id := "0b9f6a4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	for _, k := range []string{id, "urn:uuid:" + id, "{" + id + "}", strings.ReplaceAll(id, "-", ""), strings.ToUpper(id), "x", ""} {
		f.Add(api.EncodeCursor("t1", k))
	}
	f.Fuzz(func(t *testing.T, cursor string) {
		key, err := api.DecodeIDCursor("t1", cursor)
		if err != nil {
			if api.CodeOf(err) != api.CodeInvalidArgument {
				t.Fatalf("DecodeIDCursor(%q): %v, want invalid_argument", cursor, err)
			}
			return
		}
		if u, perr := uuid.Parse(key); perr != nil || u.String() != key {
			t.Fatalf("DecodeIDCursor(%q) = %q, not a canonical UUID", cursor, key)
		}
	})
}
