package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
)

// fleetCmds are the fleet group's commands (docs/fleet.md): export writes YAML, plan shows a
// diff as terraform plan does, apply applies a reviewed plan, drift says what changed since.
// They replace the commands the method table would make, which take the document as a flag.
func fleetCmds(p *profile) []*cobra.Command {
	return []*cobra.Command{fleetExportCmd(p), fleetPlanCmd(p), fleetApplyCmd(p), fleetDriftCmd(p)}
}

func fleetExportCmd(p *profile) *cobra.Command {
	var tenant, file string
	c := &cobra.Command{
		Use:   "export",
		Short: "Write the tenant's sites, pools, quotas and webhooks as one FleetConfig document (YAML)",
		Long: `Writes the tenant's fleet as a FleetConfig (apiVersion compute/v1) that manages sites, pools, quotas
and webhooks, to stdout or --file. The same state always exports to the same bytes; secrets are never
exported (a webhook's signing secret stays with its endpoint). -o json: the answer of fleet.export,
with the live state's fingerprint.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			x, err := cl.Fleet.Export(cmd.Context(), api.ExportFleet{TenantID: tenant})
			if err != nil {
				return err
			}
			if structured(p.Output) {
				return writeValue(cmd.OutOrStdout(), p.Output, x)
			}
			if file != "" {
				return writeFileAtomic(file, []byte(x.Document))
			}
			_, err = io.WriteString(cmd.OutOrStdout(), x.Document)
			return err
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant (default: the key's)")
	c.Flags().StringVarP(&file, "file", "f", "", "write the document to this file instead of stdout")
	return c
}

func fleetPlanCmd(p *profile) *cobra.Command {
	var tenant, file string
	var prune bool
	c := &cobra.Command{
		Use:   "plan -f FILE",
		Short: "Show what applying a FleetConfig would create, update and delete, field by field",
		Long: `Compares a FleetConfig (-f FILE, or - for stdin) with the live state and prints each object an apply
would create (+), update (~, with each field's old and new value) or delete (-), in the order it would,
and the fingerprint of the live state the plan was computed against: fleet apply --fingerprint applies
exactly this plan, and refuses once the state has changed. Objects of managed kinds the document does
not list are kept, unless --prune.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, err := readDocument(cmd, file)
			if err != nil {
				return err
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			d, err := cl.Fleet.Plan(cmd.Context(), api.PlanFleet{TenantID: tenant, Document: doc, Prune: prune})
			if err != nil {
				return err
			}
			if structured(p.Output) {
				return writeValue(cmd.OutOrStdout(), p.Output, d)
			}
			out := cmd.OutOrStdout()
			writePlan(out, d.TenantID, d.Changes, d.Kept, d.Summary)
			if len(d.Changes) > 0 {
				flags := ""
				if prune {
					flags = " --prune"
				}
				fmt.Fprintf(out, "\nTo apply exactly this plan:\n  better-compute fleet apply -f %s%s --fingerprint %s\n", file, flags, d.Fingerprint)
			}
			return nil
		},
	}
	fleetDocFlags(c, &tenant, &file, &prune)
	return c
}

func fleetApplyCmd(p *profile) *cobra.Command {
	var tenant, file, fingerprint string
	var prune, yes bool
	c := &cobra.Command{
		Use:   "apply -f FILE (--fingerprint FP | --yes)",
		Short: "Apply a FleetConfig in one transaction, if the live state is still the one planned",
		Long: `Applies a FleetConfig (-f FILE, or - for stdin) in one transaction, after one IAM decision
(compute:fleet:apply). --fingerprint is the one fleet plan printed: the apply is refused
(failed_precondition, stale_plan) if the live state has changed since, and then nothing is written.
--yes plans and applies at once, printing the plan. A failure part-way writes nothing. The signing
secrets of webhook endpoints the apply creates are printed once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fingerprint == "" && !yes {
				return usageError{Err: errors.New("--fingerprint FP (printed by better-compute fleet plan) or --yes (plan and apply now) is required")}
			}
			doc, err := readDocument(cmd, file)
			if err != nil {
				return err
			}
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if fingerprint == "" {
				d, err := cl.Fleet.Plan(cmd.Context(), api.PlanFleet{TenantID: tenant, Document: doc, Prune: prune})
				if err != nil {
					return err
				}
				if !structured(p.Output) {
					writePlan(out, d.TenantID, d.Changes, d.Kept, d.Summary)
					fmt.Fprintln(out)
				}
				fingerprint = d.Fingerprint
			}
			res, err := cl.Fleet.Apply(cmd.Context(), api.ApplyFleet{TenantID: tenant, Document: doc, Fingerprint: fingerprint, Prune: prune})
			if err != nil {
				return err
			}
			if structured(p.Output) {
				return writeValue(out, p.Output, res)
			}
			fmt.Fprintf(out, "Applied to tenant %s: %d created, %d updated, %d deleted (fingerprint %s).\n",
				clean(res.TenantID), res.Summary.Create, res.Summary.Update, res.Summary.Delete, clean(res.Fingerprint))
			urls := make([]string, 0, len(res.Secrets))
			for u := range res.Secrets {
				urls = append(urls, u)
			}
			sort.Strings(urls)
			for _, u := range urls {
				fmt.Fprintf(out, "Signing secret of the new webhook endpoint %s (shown once): %s\n", clean(u), clean(res.Secrets[u]))
			}
			return nil
		},
	}
	fleetDocFlags(c, &tenant, &file, &prune)
	c.Flags().StringVar(&fingerprint, "fingerprint", "", "the plan's fingerprint (better-compute fleet plan prints it)")
	c.Flags().BoolVar(&yes, "yes", false, "plan and apply now, without a reviewed fingerprint")
	return c
}

func fleetDriftCmd(p *profile) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "drift",
		Short: "Show how the live state differs now from the FleetConfig last applied",
		Long: `Compares the live state with the FleetConfig last applied to the tenant and prints what an apply of
that document would change now (~ old → new), and who applied it and when. The drift job emits
fleet.drifted once per change of drift; this reads it now.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := serverClient(p)
			if err != nil {
				return err
			}
			r, err := cl.Fleet.Drift(cmd.Context(), api.GetFleetDrift{TenantID: tenant})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if structured(p.Output) {
				return writeValue(out, p.Output, r)
			}
			if r.Applied == nil {
				fmt.Fprintf(out, "No FleetConfig has been applied to tenant %s.\n", clean(r.TenantID))
				return nil
			}
			fmt.Fprintf(out, "FleetConfig applied to tenant %s by %s at %s.\n", clean(r.TenantID), clean(r.Applied.AppliedBy), r.Applied.AppliedAt.Format(time.RFC3339))
			if !r.Drifted {
				fmt.Fprintln(out, "No drift: the live state is that document.")
				return nil
			}
			fmt.Fprintln(out, "Drift (what applying that document again would change; ~ live → document):")
			writeChanges(out, r.Changes)
			return nil
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant (default: the key's)")
	return c
}

func fleetDocFlags(c *cobra.Command, tenant, file *string, prune *bool) {
	c.Flags().StringVar(tenant, "tenant", "", "the tenant (default: the document's metadata.tenant, else the key's)")
	c.Flags().StringVarP(file, "file", "f", "", "the FleetConfig (YAML); - reads stdin")
	c.Flags().BoolVar(prune, "prune", false, "delete the objects of managed kinds that the document does not list")
}

func readDocument(cmd *cobra.Command, file string) (string, error) {
	var b []byte
	var err error
	switch file {
	case "":
		return "", usageError{Err: errors.New("-f FILE is required: a FleetConfig (better-compute fleet export writes one), or - for stdin")}
	case "-":
		b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), api.MaxFleetDocumentBytes+1))
	default:
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return "", fmt.Errorf("-f %s: %w", file, err)
	}
	return string(b), nil
}

// writePlan prints a plan as terraform plan does: a line per object, its fields indented.
func writePlan(w io.Writer, tenant string, changes []api.FleetChange, kept []api.FleetObject, s api.FleetSummary) {
	if len(changes) == 0 {
		fmt.Fprintf(w, "No changes: tenant %s's live state is the document.\n", clean(tenant))
	} else {
		fmt.Fprintf(w, "Changes to tenant %s, in the order an apply makes them:\n\n", clean(tenant))
		writeChanges(w, changes)
	}
	if len(kept) > 0 {
		fmt.Fprintln(w, "\nKept (not in the document; --prune deletes them):")
		for _, k := range kept {
			fmt.Fprintf(w, "    %s %s\n", clean(k.Kind), clean(k.Key))
		}
	}
	fmt.Fprintf(w, "\nPlan: %d to create, %d to update, %d to delete.\n", s.Create, s.Update, s.Delete)
}

func writeChanges(w io.Writer, changes []api.FleetChange) {
	marks := map[string]string{api.FleetCreate: "+", api.FleetUpdate: "~", api.FleetDelete: "-"}
	for _, c := range changes {
		where := ""
		if c.Path != "" {
			where = "  (" + clean(c.Path) + ")"
		}
		fmt.Fprintf(w, "  %s %s %s%s\n", marks[c.Action], clean(c.Kind), clean(c.Key), where)
		for _, f := range c.Fields {
			switch c.Action {
			case api.FleetCreate:
				fmt.Fprintf(w, "      %s: %s\n", clean(f.Field), value(f.New))
			case api.FleetDelete:
				fmt.Fprintf(w, "      %s: %s\n", clean(f.Field), value(f.Old))
			default:
				fmt.Fprintf(w, "      %s: %s → %s\n", clean(f.Field), value(f.Old), value(f.New))
			}
		}
	}
}

// value shows a field's value as JSON, none for nothing.
func value(v any) string {
	b, err := json.Marshal(v)
	if err != nil || string(b) == "null" || string(b) == `""` || string(b) == "{}" || string(b) == "[]" {
		return "(none)"
	}
	return clean(strings.TrimSpace(string(b)))
}

// writeFileAtomic replaces file with b through a temporary file and a rename: a crash never
// leaves half a document.
func writeFileAtomic(file string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".fleet-*")
	if err != nil {
		return fmt.Errorf("--file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("--file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--file: %w", err)
	}
	return os.Rename(tmp.Name(), file)
}
