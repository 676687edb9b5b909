package api

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
