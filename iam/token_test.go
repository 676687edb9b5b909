package iam

import (
	"errors"
	"strings"
	"testing"
)

func TestTokenRoundTrip(t *testing.T) {
	t.Parallel()
	for _, kind := range []TokenKind{TokenSession, TokenAPIKey, TokenRole, TokenSTS, TokenDelegation} {
		tok := NewToken(kind)
		if want := len("biam_") + len(kind) + 1 + 43 + 6; len(tok) != want {
			t.Fatalf("%s token %q has length %d, want %d", kind, tok, len(tok), want)
		}
		got, err := ParseToken(tok)
		if err != nil || got != kind {
			t.Fatalf("ParseToken(%q) = %q, %v", tok, got, err)
		}
	}
	if a, b := NewToken(TokenAPIKey), NewToken(TokenAPIKey); a == b {
		t.Fatal("two tokens are equal")
	}
}

func TestParseTokenErrors(t *testing.T) {
	t.Parallel()
	good := NewToken(TokenAPIKey)
	cases := map[string]string{
		"empty":          "",
		"other system":   "ghp_" + strings.Repeat("a", 40),
		"no kind":        "biam_" + strings.Repeat("a", 49),
		"unknown kind":   "biam_xyz_" + good[9:],
		"short":          good[:len(good)-1],
		"long":           good + "A",
		"not base64url":  good[:20] + "!" + good[21:],
		"wrong checksum": good[:len(good)-6] + "AAAAAA",
		"body changed":   good[:12] + string(rune(good[12]^1)) + good[13:],
	}
	for name, tok := range cases {
		if _, err := ParseToken(tok); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: ParseToken(%q) = %v, want ErrUnauthenticated", name, tok, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(NewToken(TokenAPIKey))
	f.Add("biam_key_")
	f.Add("biam__" + strings.Repeat("A", 49))
	f.Fuzz(func(t *testing.T, s string) {
		kind, err := ParseToken(s)
		if err == nil && !strings.HasPrefix(s, "biam_"+string(kind)+"_") {
			t.Fatalf("accepted %q as kind %q", s, kind)
		}
		if err != nil && !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("error %v does not wrap ErrUnauthenticated", err)
		}
	})
}
