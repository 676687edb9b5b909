package app

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/daemon"
	"github.com/better-compute/compute/bcd/internal/selfupdate"
)

// selfUpdateFlags are bcd node's flags for self-update (docs/releases.md).
type selfUpdateFlags struct {
	enabled  bool
	root     string
	deadline time.Duration
}

func (f *selfUpdateFlags) flags(c *cobra.Command) {
	c.Flags().BoolVar(&f.enabled, "self-update", f.enabled, "install the bcd releases the control plane's rollouts name (A/B slots under the state directory; off when a package manager owns bcd)")
	c.Flags().StringVar(&f.root, "release-root", "", "the release repository's root.json to trust (default: the repository's first root, fetched over the gateway's mutual TLS on first use)")
	c.Flags().DurationVar(&f.deadline, "update-deadline", f.deadline, "how long an updated bcd has to reach its gateway before it is rolled back")
}

// restartInto is the cause of a node's stop to exec another slot's binary.
type restartInto struct{ path string }

func (r restartInto) Error() string { return "restart into " + r.path }

// start checks a trial at start (a new binary started too often rolls back, here, at once) and
// returns the daemon's self-update settings, nil when off.
func (f *selfUpdateFlags) start(stateDir string, logger *slog.Logger, restart func(string)) (*daemon.SelfUpdate, error) {
	if !f.enabled {
		return nil, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("self-update: find this binary: %w (or run with --self-update=false)", err)
	}
	slots := daemon.SlotsOf(stateDir)
	if slot := slots.SlotOf(self); slot != "" {
		t, err := slots.Boot(slot, selfupdate.MaxBoots)
		if err != nil {
			return nil, err
		}
		if t != nil {
			logger.Error("bcd: the updated binary keeps restarting; rolled back", "version", t.Version, "to", t.PreviousVersion)
			return nil, selfupdate.Exec(slots.Path(t.Previous))
		}
	}
	su := &daemon.SelfUpdate{Self: self, Deadline: f.deadline, Restart: restart}
	if f.root != "" {
		if su.Root, err = os.ReadFile(f.root); err != nil {
			return nil, fmt.Errorf("--release-root: %w", err)
		}
	}
	return su, nil
}

func superviseCmd(s *settings) *cobra.Command {
	var grace time.Duration
	c := &cobra.Command{
		Use:   "supervise [-- node [flags]]",
		Short: "Run bcd node from its current slot, restart it, and roll back an update that does not reach its gateway",
		Long: `supervise is what a unit runs (ExecStart=/usr/local/bin/bcd supervise -- node …): it runs the binary of
the current slot under the state directory (seeding slot a with itself on the first run), with the
arguments after --, and runs it again when it exits. While an update is on trial it rolls back to
the previous slot when the new binary exits or has not reached its gateway by the trial's deadline.
Without arguments it runs node; --state-dir is passed on unless given.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"node"}
			}
			if !slices.ContainsFunc(args, func(a string) bool { return a == "--state-dir" || len(a) > 12 && a[:12] == "--state-dir=" }) {
				args = append(args, "--state-dir", s.StateDir)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, cancel := signals()
			defer cancel()
			sv := &selfupdate.Supervisor{Slots: daemon.SlotsOf(s.StateDir), Self: self, Args: args, Grace: grace,
				Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(), Logger: s.logger(cmd.ErrOrStderr())}
			return sv.Run(ctx)
		},
	}
	c.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long after a trial's deadline the supervisor rolls back (the new binary's own check acts first)")
	return c
}
