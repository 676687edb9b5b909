package api

import (
	"encoding/base64"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Page sizes for list methods.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// PageRequest is embedded in every list input. Cursor is the NextCursor of the previous page,
// opaque to the caller.
type PageRequest struct {
	Cursor string `json:"cursor,omitempty"`
	Limit  int    `json:"limit,omitempty"` // 0 means DefaultPageLimit
}

// Validate checks the limit and the cursor's size.
func (p PageRequest) Validate() error {
	if p.Limit < 0 || p.Limit > MaxPageLimit {
		return InvalidField("limit", "must be between 1 and %d (0 means %d), got %d", MaxPageLimit, DefaultPageLimit, p.Limit)
	}
	if len(p.Cursor) > 512 {
		return InvalidField("cursor", "is not a cursor returned by this API")
	}
	return nil
}

// PageLimit returns the effective limit.
func (p PageRequest) PageLimit() int {
	if p.Limit == 0 {
		return DefaultPageLimit
	}
	return p.Limit
}

// Page is one page of a list. NextCursor is empty on the last page.
type Page[T any] struct {
	Items      []T    `json:"items"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// EncodeCursor returns the opaque cursor of a list of kind (a short tag such as "q1", which
// versions the key's format) that resumes after key.
func EncodeCursor(kind, key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + key))
}

// DecodeCursor returns the key of a cursor that EncodeCursor made for kind. Any other string,
// and any key that is not text the database can compare (invalid UTF-8, NUL or other control
// characters), is an invalid_argument error naming the cursor field.
func DecodeCursor(kind, cursor string) (string, error) {
	bad := InvalidField("cursor", "is not a cursor returned by this API")
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return "", bad
	}
	key, ok := strings.CutPrefix(string(b), kind+":")
	if !ok || !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return "", bad
	}
	return key, nil
}

// PageOf is the page of a list read with limit+1 rows: the first limit of items and, when there
// were more, the cursor of kind that resumes after the last one's key.
func PageOf[T any](items []T, limit int, kind string, key func(T) string) Page[T] {
	if items == nil {
		items = []T{}
	}
	p := Page[T]{Items: items}
	if len(items) > limit {
		p.Items = items[:limit]
		p.NextCursor = EncodeCursor(kind, key(items[limit-1]))
	}
	return p
}

// DecodeIDCursor is DecodeCursor for a cursor whose key is a row's id (a UUID): a key that is
// not one is the same invalid_argument, never a query that fails on its cast. The key is
// returned in the canonical form, which the database reads: the uuid package also accepts
// forms it does not ("urn:uuid:…").
func DecodeIDCursor(kind, cursor string) (string, error) {
	key, err := DecodeCursor(kind, cursor)
	if err != nil {
		return "", err
	}
	id, err := uuid.Parse(key)
	if err != nil {
		return "", InvalidField("cursor", "is not a cursor returned by this API")
	}
	return id.String(), nil
}
