// Package usage makes every mistake in a cobra command line an Error, which the programs
// (better-compute, bcd) answer with exit code 2: flag errors, argument counts, and a word that
// names no subcommand (cobra would print the group's help and succeed).
package usage

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Error is a mistake in how a program was called.
type Error struct{ Err error }

func (e Error) Error() string { return e.Err.Error() }
func (e Error) Unwrap() error { return e.Err }

// Is reports whether err is, or wraps, an Error.
func Is(err error) bool { return errors.As(err, new(Error)) }

// Strict makes every command line mistake under c an Error.
func Strict(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return Error{err} })
	c.SuggestionsMinimumDistance = 2
	if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help() // the group alone: its help, as asked
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return Error{errors.New(msg)}
		}
	} else if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return Error{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		Strict(sub)
	}
}
