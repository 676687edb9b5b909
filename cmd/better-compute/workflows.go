package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// workflowsWatchCmd follows a run until it finishes: better-compute workflows watch RUN.
func workflowsWatchCmd(p *profile) *cobra.Command {
	var run string
	var every time.Duration
	c := &cobra.Command{
		Use:   "watch [run]",
		Short: "Follow a workflow run's steps until it finishes, with a progress bar",
		Long: "Prints a line each time the run's progress changes: a bar of its steps, the current step, its state, " +
			"attempts and what it waits for. Exits 0 when the run succeeds, 1 when it fails or is cancelled " +
			"(-o json: the run as JSON, each time it changes).",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if run != "" && run != args[0] {
					return usageError{Err: fmt.Errorf("the run is %s or %s (--run): give one", args[0], run)}
				}
				run = args[0]
			}
			if err := (api.GetWorkflow{Run: run}).Validate(); err != nil {
				return usageError{Err: fmt.Errorf("--run: %w", err)}
			}
			if every <= 0 {
				return usageError{Err: fmt.Errorf("--every %s: must be positive", every)}
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			r, err := watchRun(ctx, cl, run, every, func(r api.WorkflowRun) error {
				if structured(p.Output) {
					return writeStream(cmd.OutOrStdout(), p.Output, r)
				}
				_, err := fmt.Fprintln(cmd.OutOrStdout(), clean(progressLine(r)))
				return err
			})
			if err != nil {
				if ctx.Err() != nil && cmd.Context().Err() == nil {
					return nil // interrupted
				}
				return err
			}
			if r.State != api.WorkflowSucceeded {
				return fmt.Errorf("workflow %s %s: %s", r.Workflow, r.State, r.Error)
			}
			return nil
		},
	}
	c.Flags().StringVar(&run, "run", "", "the run's id (machines.power and others answer it); or give it as the argument")
	c.Flags().DurationVar(&every, "every", 500*time.Millisecond, "how often to look")
	return c
}

// watchRun calls show with the run each time its progress changes, until it finishes, and
// returns it as it finished.
func watchRun(ctx context.Context, cl *client.Client, id string, every time.Duration, show func(api.WorkflowRun) error) (api.WorkflowRun, error) {
	last := ""
	for {
		r, err := cl.Workflows.Get(ctx, api.GetWorkflow{Run: id})
		if err != nil {
			return r, err
		}
		if line := progressLine(r); line != last {
			last = line
			if err := show(r); err != nil {
				return r, err
			}
		}
		if r.State != api.WorkflowRunning {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(every):
		}
	}
}

// progressLine is a run's progress in one line:
//
//	[##--] 2/4 drain            running (attempt 1), waiting: GPU 3 is held by reservation … until …
func progressLine(r api.WorkflowRun) string {
	done, current := 0, api.WorkflowStep{Name: r.Step}
	for _, s := range r.Steps {
		if s.State == api.StepSucceeded {
			done++
		}
		if s.Name == r.Step {
			current = s
		}
	}
	bar := strings.Repeat("#", done) + strings.Repeat("-", len(r.Steps)-done)
	line := fmt.Sprintf("[%s] %d/%d %-16s", bar, done, len(r.Steps), current.Name)
	switch {
	case r.State != api.WorkflowRunning:
		line += " " + r.State
		if r.Error != "" {
			line += ": " + r.Error
		}
	default:
		line += fmt.Sprintf(" %s (attempt %d)", current.State, max(current.Attempts, 1))
		if current.Note != "" {
			line += ", waiting: " + current.Note
		} else if current.Error != "" {
			line += ": last attempt: " + current.Error
		}
	}
	return line
}
