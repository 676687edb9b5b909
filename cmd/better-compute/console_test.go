package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestConsoleTargetsAreExclusive: console attaches to one thing. --instance and --sandbox name a
// VM, whose host the module finds: with each other, or with a node's flags, the command line is
// a usage error rather than one of them silently ignored.
func TestConsoleTargetsAreExclusive(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	for _, args := range [][]string{
		{"--instance", "web", "--sandbox", "job-1"},
		{"--instance", "web", "--reservation", "R"},
		{"--sandbox", "job-1", "--node", "n1"},
		{"--instance", "web", "--console", "vm-0"},
		{"--sandbox", "job-1", "--break-glass", "--reason", "x"},
	} {
		var stdout, stderr bytes.Buffer
		all := append([]string{"console", "--server", "http://127.0.0.1:1", "--api-key", "k"}, args...)
		if code := run(all, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "give one") {
			t.Errorf("better-compute %s exited %d, want %d and a usage error\nstderr: %s", strings.Join(all, " "), code, exitUsage, &stderr)
		}
	}
}
