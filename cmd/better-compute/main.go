// Command better-compute is the CLI of Better Compute: a subcommand per API group and method,
// driven by the method table (better-compute pools list, better-compute reservations create
// --pool h100 --gpus 8), and the commands that run the control plane: dev (the development
// server, with simulated nodes), serve (the control plane for real, in any process mode) and sim
// (simulated nodes against a running control plane).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/api"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		fmt.Fprintf(os.Stderr, "better-compute: %s: %s\n", ae.Code, ae.Message)
		if f, ok := ae.Details["field"]; ok {
			fmt.Fprintf(os.Stderr, "  field: %v\n", f)
		}
		return 1
	}
	fmt.Fprintln(os.Stderr, "better-compute:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// usageError is a mistake in the command line.
type usageError struct{ error }

// profile is where the API calls go: flags, then $BETTER_COMPUTE_URL and
// $BETTER_COMPUTE_API_KEY, then the config file.
type profile struct {
	URL    string `json:"url"`
	APIKey string `json:"apiKey"`
	Output string `json:"output,omitempty"`
}

func defaultConfigPath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "better-compute", "config.json")
}

func newRoot() *cobra.Command {
	p := &profile{}
	var configPath string
	root := &cobra.Command{
		Use:   "better-compute",
		Short: "The Better Compute CLI: the API, the development server and the control plane",
		Long: `better-compute calls a Better Compute control plane: one subcommand per group and method of its API
(better-compute pools list; better-compute reservations create --pool h100 --gpus 8), printing tables for
people and JSON for scripts (-o json). It also runs the control plane: dev (a development server with
simulated nodes), serve (the real thing, in any process mode) and sim (simulated nodes).

Where calls go: --url and --api-key, else $BETTER_COMPUTE_URL and $BETTER_COMPUTE_API_KEY, else the
config file (--config, default ` + defaultConfigPath() + `: {"url": …, "apiKey": …}).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return p.load(cmd, configPath)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&p.URL, "url", "", "the control plane's URL ($BETTER_COMPUTE_URL)")
	pf.StringVar(&p.APIKey, "api-key", "", "an API key ($BETTER_COMPUTE_API_KEY)")
	pf.StringVar(&configPath, "config", "", "config file")
	pf.StringVarP(&p.Output, "output", "o", "table", "table or json")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	for _, g := range apiCommands(p) {
		root.AddCommand(g)
	}
	root.AddCommand(devCmd(), serveCmd(), simCmd(p), iamCmd(p), mcpCmd(p))
	return root
}

func (p *profile) load(cmd *cobra.Command, path string) error {
	if p.Output != "table" && p.Output != "json" {
		return usageError{fmt.Errorf("-o %q: use table or json", p.Output)}
	}
	var file profile
	explicit := path != ""
	if !explicit {
		path = defaultConfigPath()
	}
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			if err := json.Unmarshal(b, &file); err != nil {
				return fmt.Errorf("config %s: %w", path, err)
			}
		case explicit || !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("config: %w", err)
		}
	}
	pick := func(flag, env, fromFile string, dst *string) {
		if cmd.Flags().Changed(flag) {
			return
		}
		if v := os.Getenv(env); v != "" {
			*dst = v
		} else if fromFile != "" {
			*dst = fromFile
		}
	}
	pick("url", "BETTER_COMPUTE_URL", file.URL, &p.URL)
	pick("api-key", "BETTER_COMPUTE_API_KEY", file.APIKey, &p.APIKey)
	return nil
}
