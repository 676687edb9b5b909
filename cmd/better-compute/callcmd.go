package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// The server's own method table drives these two: they reach every method it serves, its
// modules' included, which this binary has no subcommands for.

func serverClient(p *profile) (*client.Client, error) {
	if p.URL == "" {
		return nil, usageError{Err: errors.New("no control plane: pass --server or set BETTER_COMPUTE_URL")}
	}
	return client.New(p.URL, client.WithAPIKey(p.APIKey), client.WithUserAgent("better-compute/"+version))
}

func methodsCmd(p *profile) *cobra.Command {
	return &cobra.Command{
		Use:   "methods",
		Short: "List every method the control plane serves, its modules' included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			ms, err := cl.Methods(ctx)
			if err != nil {
				return err
			}
			if structured(p.Output) {
				return writeValue(cmd.OutOrStdout(), p.Output, map[string]any{"methods": ms})
			}
			for _, m := range ms {
				kind := "read"
				if m.Mutating {
					kind = "change"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%-28s %-6s %s\n", clean(m.FullName()), kind, clean(m.Summary))
			}
			return nil
		},
	}
}

func callCmd(p *profile) *cobra.Command {
	var raw, key string
	cmd := &cobra.Command{
		Use:   "call GROUP.METHOD",
		Short: "Call any method the control plane serves, with its input as JSON",
		Long: `call invokes a method by its name in the server's method table (better-compute methods lists
them), a module's included: better-compute call pings.send --json '{"node": "…", "message": "hi"}'.
The server checks the input as strictly as any call's: an unknown field is refused, by name.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			ms, err := cl.Methods(ctx)
			if err != nil {
				return err
			}
			var info *api.MethodInfo
			for _, m := range ms {
				if m.FullName() == args[0] {
					info = &m.MethodInfo
				}
			}
			if info == nil {
				return usageError{Err: fmt.Errorf("the control plane serves no method %q (better-compute methods lists them)", args[0])}
			}
			body := json.RawMessage(strings.TrimSpace(raw))
			if len(body) == 0 {
				body = json.RawMessage("{}")
			}
			if !json.Valid(body) {
				return usageError{Err: errors.New("--json: not valid JSON")}
			}
			if key != "" {
				ctx = api.WithIdempotencyKey(ctx, key)
			}
			out, err := cl.Do(ctx, *info, body)
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), p.Output, out)
		},
	}
	cmd.Flags().StringVar(&raw, "json", "", "the input, a JSON object (default {})")
	cmd.Flags().StringVar(&key, "idempotency-key", "", "for a change: the same key and input return the first answer")
	return cmd
}
