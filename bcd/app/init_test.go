package app

import (
	"slices"
	"testing"
)

// TestPID1Args: the kernel starts bcd as a ramdisk's /init with no subcommand; anything else runs
// as it was called.
func TestPID1Args(t *testing.T) {
	for _, c := range []struct {
		pid  int
		in   []string
		want []string
	}{
		{1, []string{"/init"}, []string{"init", "--"}},
		{1, []string{"/init", "quiet", "splash"}, []string{"init", "--", "quiet", "splash"}},
		{1, []string{"/init", "init"}, []string{"init"}},
		{1, []string{"/usr/bin/bcd", "node"}, []string{"node"}},
		{42, []string{"/init"}, []string{}},
		{42, []string{"bcd", "site", "--dhcp", "off"}, []string{"site", "--dhcp", "off"}},
	} {
		if got := pid1Args(c.pid, c.in); !slices.Equal(got, c.want) {
			t.Errorf("pid %d %q: %q, want %q", c.pid, c.in, got, c.want)
		}
	}
}
