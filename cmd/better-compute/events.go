package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// eventsWatchCmd follows the event log: better-compute events watch.
func eventsWatchCmd(p *profile) *cobra.Command {
	var o client.WatchOptions
	var count int
	c := &cobra.Command{
		Use:   "watch",
		Short: "Follow the event log as it grows, resuming after a dropped connection without a gap",
		Long: "Prints each event of the tenant as it is written, oldest first: its id, time, type, subject and data " +
			"(-o json: one JSON object a line). --after resumes after an event id; --count stops after that many events.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 0 {
				return usageError{fmt.Errorf("--count %d: must not be negative", count)}
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			out := cmd.OutOrStdout()
			n := 0
			enough := errors.New("enough")
			err = cl.WatchEvents(ctx, o, func(e api.Event) error {
				if structured(p.Output) {
					if err := writeStream(out, p.Output, e); err != nil {
						return err
					}
				} else {
					data, _ := json.Marshal(e.Data)
					fmt.Fprintf(out, "%-8d %s  %-26s %-36s %s\n", e.ID, e.CreatedAt.Format(time.RFC3339), clean(e.Type), clean(e.Subject), clean(string(data)))
				}
				if n++; count > 0 && n >= count {
					return enough
				}
				return nil
			})
			if errors.Is(err, enough) || (ctx.Err() != nil && cmd.Context().Err() == nil) {
				return nil // done, or interrupted
			}
			return err
		},
	}
	f := c.Flags()
	f.Int64Var(&o.After, "after", 0, "resume after this event id")
	f.StringVar(&o.TenantID, "tenant-id", "", "the tenant (default: the key's)")
	f.StringVar(&o.Type, "type", "", `an event type, or a prefix ending in "." (e.g. node.)`)
	f.StringVar(&o.Subject, "subject", "", "the id of what the events are about")
	f.IntVar(&count, "count", 0, "stop after this many events (0: follow until interrupted)")
	return c
}
