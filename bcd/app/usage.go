package app

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/agent/ext"
)

// Exit codes, the better-compute CLI's: 0 success, 1 a failure while running, 2 a mistake in
// the command line (an unknown command or flag, a bad flag value, a missing or extra argument,
// a required flag not given).
const (
	exitError = 1
	exitUsage = 2
)

// usageError is a mistake in the command line.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

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

// strictUsage makes every command line mistake under c a usage error: flag errors, argument
// counts, and an unknown subcommand (cobra answers a group's unknown subcommand with the
// group's help and success when the group runs nothing itself).
func strictUsage(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	c.SuggestionsMinimumDistance = 2
	if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageError{errors.New(msg)}
		}
	} else if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		strictUsage(sub)
	}
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
