package app

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/internal/lib/usage"
)

// Exit codes, the better-compute CLI's: 0 success, 1 a failure while running, 2 a mistake in
// the command line (an unknown command or flag, a bad flag value, a missing or extra argument,
// a required flag not given).
const (
	exitError = 1
	exitUsage = 2
)

// usageError is a mistake in the command line.
type usageError = usage.Error

// run runs bcd with args and returns its exit code.
func run(exts []ext.Extension, args []string, stdout, stderr io.Writer) int {
	root := newRoot(exts)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "bcd:", err)
	if errors.As(err, new(usageError)) {
		fmt.Fprintln(stderr, "  (add --help for usage)")
		return exitUsage
	}
	return exitError
}

// nextStep is the bcd node command that follows a join: with the --config and --state-dir the
// join was given, so that the node finds the identity it kept.
func nextStep(join *cobra.Command) string {
	parts := []string{"bcd", "node"}
	for _, name := range []string{"config", "state-dir"} {
		if f := join.Flags().Lookup(name); f != nil && f.Changed {
			parts = append(parts, "--"+name, shellQuote(f.Value.String()))
		}
	}
	return strings.Join(parts, " ")
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:=@%+,-]+$`)

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
