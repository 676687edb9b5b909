package app

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrorsExit2: a mistake in bcd's command line exits 2, as the better-compute CLI's do
// (it exited 1, like a failure while running), and says what was wrong; a command that fails
// while running still exits 1.
func TestUsageErrorsExit2(t *testing.T) {
	state := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"nosuch"}, 2, `unknown command "nosuch"`},
		{[]string{"stauts"}, 2, "status"}, // a suggestion
		{[]string{"status", "--nosuch"}, 2, "unknown flag: --nosuch"},
		{[]string{"status", "extra"}, 2, "unknown command"},
		{[]string{"node", "--fake-gpus", "many"}, 2, "--fake-gpus"},
		{[]string{"join", "--state-dir", state}, 2, "join needs --url"},
		{[]string{"sim"}, 2, "sim needs --nodes"},
		{[]string{"helper"}, 2, "helper needs --socket"},
		{[]string{"helper", "call", "hello"}, 2, "call needs --socket"},
		{[]string{"helper", "call"}, 2, "accepts between 1 and 2 arg(s)"},
		{[]string{"site", "--address", "x"}, 2, "--address"},
		{[]string{"site", "--address", "10.0.0.2", "--dhcp-range", "10.0.0.1"}, 2, "--dhcp-range"},
		{[]string{"--config", filepath.Join(state, "missing.json"), "status"}, 1, "config"},
		{[]string{"version"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(nil, c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("bcd %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(c.args, " "), code, stderr.String(), c.code, c.says)
		}
		if c.code == 2 && !strings.Contains(stderr.String(), "--help") {
			t.Errorf("bcd %s: a usage error that does not point at --help: %q", strings.Join(c.args, " "), stderr.String())
		}
	}
}

// TestNextStepKeepsTheStateDir: join's "now run: bcd node" hint carries the --state-dir and
// --config just used (it dropped them, so the node it named looked in /var/lib/bcd).
func TestNextStepKeepsTheStateDir(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"join"}, "bcd node"},
		{[]string{"join", "--state-dir", "/tmp/bcd"}, "bcd node --state-dir /tmp/bcd"},
		{[]string{"--state-dir=/tmp/my bcd", "join", "--config", "/etc/b.json"}, "bcd node --config /etc/b.json --state-dir '/tmp/my bcd'"},
	} {
		root := newRoot(nil)
		cmd, rest, err := root.Find(c.args)
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatal(err)
		}
		if got := nextStep(cmd); got != c.want {
			t.Errorf("%q: %q, want %q", c.args, got, c.want)
		}
	}
}
