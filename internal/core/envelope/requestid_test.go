package envelope

import (
	"strings"
	"testing"
)

func TestValidRequestID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"", false},
		{"4bf92f3577b34da6", true},
		{"caller:req-1_a.b", true},
		{strings.Repeat("x", MaxRequestIDLength), true},
		{strings.Repeat("x", MaxRequestIDLength+1), false},
		{"has space", false},
		{"quote\"", false},
		{"new\nline", false},
		{"é", false},
	} {
		if got := ValidRequestID(tc.id); got != tc.want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}
