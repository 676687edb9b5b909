package app

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConsoles(t *testing.T) {
	got, err := parseConsoles([]string{"=unix:/run/serial.sock", "ttyS1=unix:/run/s1.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"": "/run/serial.sock", "ttyS1": "/run/s1.sock"}, got); diff != "" {
		t.Fatal(diff)
	}
	for _, bad := range [][]string{{"ttyS0"}, {"ttyS0=/run/s.sock"}, {"ttyS0=unix:run/s.sock"}, {"tcp=tcp:127.0.0.1:1"}, {"a=unix:/x", "a=unix:/y"}} {
		if _, err := parseConsoles(bad); err == nil || !strings.Contains(err.Error(), "--console") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
