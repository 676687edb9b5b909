package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	var fromNow bool
	c := &cobra.Command{
		Use:   "watch",
		Short: "Follow the event log as it grows, resuming after a dropped connection without a gap",
		Long: "Prints each event of the tenant as it is written, oldest first: its id, time, type, subject and data " +
			"(-o json: one JSON object a line; -o yaml: a document each). From the log's beginning, or after an event " +
			"id (--after), or only what is written from now on (--from-now); --count stops after that many events.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 0 {
				return usageError{Err: fmt.Errorf("--count %d: must not be negative", count)}
			}
			if fromNow && cmd.Flags().Changed("after") {
				return usageError{Err: errors.New("--from-now and --after: give one")}
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			if fromNow {
				if o.After, err = lastEventID(ctx, cl, o.TenantID); err != nil {
					return err
				}
			}
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
	f.BoolVar(&fromNow, "from-now", false, "only the events written from now on")
	return c
}

// lastEventID is the id of the newest event of the tenant the key may see (0: none). The log
// has no read from its end, but whether there is an event after an id only changes once, from
// yes to no, as the id grows: each events.list of one event says so and names the next, so
// doubling past it and then halving finds the last in about 2·log2(its id) reads.
func lastEventID(ctx context.Context, cl *client.Client, tenant string) (int64, error) {
	return lastID(func(after int64) (int64, error) {
		page, err := cl.Events.List(ctx, api.ListEvents{TenantID: tenant, After: after, PageRequest: api.PageRequest{Limit: 1}})
		if err != nil || len(page.Items) == 0 {
			return 0, err
		}
		return page.Items[0].ID, nil
	})
}

// lastID is the largest of a set of positive ids, given next: the least id of the set past an
// id, or 0.
func lastID(next func(after int64) (int64, error)) (int64, error) {
	// The last id lies in [lo, hi]: lo is an event's id (or 0), and there is none after hi.
	lo, hi := int64(0), int64(0)
	for {
		id, err := next(hi)
		if err != nil {
			return 0, err
		}
		if id == 0 {
			break
		}
		lo, hi = id, math.MaxInt64
		if id <= math.MaxInt64/2 {
			hi = 2 * id
		}
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		id, err := next(mid)
		switch {
		case err != nil:
			return 0, err
		case id == 0:
			hi = mid
		default:
			lo = id
		}
	}
	return lo, nil
}
