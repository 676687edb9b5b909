package iam

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
)

// TokenKind is the kind a token names after "biam_".
type TokenKind string

// The token kinds of Better IAM.
const (
	TokenSession    TokenKind = "ses"
	TokenAPIKey     TokenKind = "key"
	TokenRole       TokenKind = "rol"
	TokenSTS        TokenKind = "sts"
	TokenDelegation TokenKind = "dlg"
)

const (
	tokenBodyLen     = 43 // base64url of 32 random bytes
	tokenChecksumLen = 6  // base64url of a CRC-32
)

var b64 = base64.RawURLEncoding

// NewToken makes a token of kind: biam_<kind>_ + 43 base64url characters of 32 random bytes + a
// 6-character base64url CRC-32 of everything before it.
func NewToken(kind TokenKind) string {
	var secret [32]byte
	_, _ = rand.Read(secret[:])
	prefix := "biam_" + string(kind) + "_" + b64.EncodeToString(secret[:])
	return prefix + checksum(prefix)
}

func checksum(prefix string) string {
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc32.ChecksumIEEE([]byte(prefix)))
	return b64.EncodeToString(sum[:])
}

// ParseToken checks a token's shape and checksum without a database, so that a typo or a token
// of another system is refused cheaply, and returns its kind.
func ParseToken(token string) (TokenKind, error) {
	rest, ok := strings.CutPrefix(token, "biam_")
	if !ok {
		return "", fmt.Errorf("%w: not a Better IAM token (they start with biam_)", ErrUnauthenticated)
	}
	kind, body, ok := strings.Cut(rest, "_")
	if !ok {
		return "", fmt.Errorf("%w: malformed token: no kind", ErrUnauthenticated)
	}
	switch TokenKind(kind) {
	case TokenSession, TokenAPIKey, TokenRole, TokenSTS, TokenDelegation:
	default:
		return "", fmt.Errorf("%w: unknown token kind %q", ErrUnauthenticated, kind)
	}
	if len(body) != tokenBodyLen+tokenChecksumLen {
		return "", fmt.Errorf("%w: malformed token: wrong length", ErrUnauthenticated)
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", fmt.Errorf("%w: malformed token: not base64url", ErrUnauthenticated)
		}
	}
	split := len(token) - tokenChecksumLen
	if checksum(token[:split]) != token[split:] {
		return "", fmt.Errorf("%w: token checksum does not match (mistyped or truncated?)", ErrUnauthenticated)
	}
	return TokenKind(kind), nil
}

// HashToken is what is stored of a token: its SHA-256.
func HashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}
