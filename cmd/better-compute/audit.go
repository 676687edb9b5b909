package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// auditVerifyCmd checks a saved checkpoint against the live event log: better-compute audit verify.
func auditVerifyCmd(p *profile) *cobra.Command {
	var file, key string
	var update bool
	c := &cobra.Command{
		Use:   "verify --checkpoint FILE",
		Short: "Check a saved checkpoint against the live event log; fail loudly when the log was changed",
		Long: `Reads a checkpoint saved with "better-compute audit checkpoint -o json > FILE" and proves, from the
live event log, that the log still holds the events it covered, unchanged and in order: the saved and
the latest checkpoint are signed by the same key (the saved one's, or --key), the latest extends the
saved one, and the events the log holds now hash to the latest's root. Any mismatch (an event edited,
deleted or reordered in SQL after a checkpoint covered it) exits 1 with AUDIT FAILED and what is wrong.
--update then writes the latest checkpoint to FILE, for the next run. Only keys of the root tenant
may read the audit tree.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageError{Err: errors.New("--checkpoint FILE is required: save one with better-compute audit checkpoint -o json > FILE")}
			}
			saved, err := readCheckpoint(file)
			if err != nil {
				return err
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			latest, err := cl.VerifyCheckpoint(ctx, saved, key)
			if errors.Is(err, client.ErrAuditFailed) {
				return &api.Error{Code: api.CodeFailedPrecondition,
					Message: "AUDIT FAILED: " + strings.TrimPrefix(err.Error(), client.ErrAuditFailed.Error()+": "),
					Details: map[string]any{"reason": "audit_failed", "checkpoint": file}}
			}
			if err != nil {
				return err
			}
			if update {
				if err := writeCheckpoint(file, latest); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			if structured(p.Output) {
				return writeValue(out, p.Output, map[string]any{"verified": true, "saved": saved.Size, "latest": latest})
			}
			fmt.Fprintf(out, "OK: the event log holds events 1..%d of the saved checkpoint unchanged, and the latest checkpoint (%d events, %s) extends it\n",
				saved.Size, latest.Size, latest.CreatedAt.Format(time.RFC3339))
			if update {
				fmt.Fprintf(out, "saved the latest checkpoint to %s\n", file)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&file, "checkpoint", "", "a checkpoint saved with better-compute audit checkpoint -o json")
	f.StringVar(&key, "key", "", "the note verifier key the checkpoints must be signed by (default: the saved checkpoint's)")
	f.BoolVar(&update, "update", false, "after a success, replace the saved checkpoint with the latest")
	return c
}

func readCheckpoint(file string) (api.Checkpoint, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return api.Checkpoint{}, fmt.Errorf("--checkpoint: %w", err)
	}
	var cp api.Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return api.Checkpoint{}, usageError{Err: fmt.Errorf("--checkpoint %s: not a checkpoint saved with better-compute audit checkpoint -o json: %w", file, err)}
	}
	if cp.Note == "" {
		return api.Checkpoint{}, usageError{Err: fmt.Errorf("--checkpoint %s: has no signed note: save one with better-compute audit checkpoint -o json", file)}
	}
	return cp, nil
}

// writeCheckpoint replaces file with cp, through a temporary file and a rename, so that a crash
// never leaves half a checkpoint.
func writeCheckpoint(file string, cp api.Checkpoint) error {
	b, err := json.MarshalIndent(cp, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("--update: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("--update: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--update: %w", err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return fmt.Errorf("--update: %w", err)
	}
	return nil
}
