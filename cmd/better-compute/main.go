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
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/internal/lib/usage"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes: 0 success, 1 an error from the API or while running, 2 a mistake in the command
// line (an unknown command or flag, a missing or extra argument, input that does not decode).
const (
	exitError = 1
	exitUsage = 2
)

func run(args []string, stdout, stderr io.Writer) int { return runWith(os.Stdin, args, stdout, stderr) }

// runWith runs the CLI with args and standard input, output and error, and returns its exit code.
func runWith(stdin io.Reader, args []string, stdout, stderr io.Writer) int {
	p := &profile{}
	root := newRoot(p)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var re remoteExit
	if errors.As(err, &re) {
		return re.code // the remote command's; it said what it had to
	}
	return report(stderr, p.Output, err)
}

// usageError is a mistake in the command line.
type usageError = usage.Error

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

func newRoot(p *profile) *cobra.Command {
	var configPath string
	root := &cobra.Command{
		Use:   "better-compute",
		Short: "The Better Compute CLI: the API, the development server and the control plane",
		Long: `better-compute calls a Better Compute control plane: one subcommand per group and method of its API
(better-compute pools list; better-compute reservations create --pool h100 --gpus 8; the metal and vps
modules' groups too: machines, instances, sandboxes…), printing tables for people (-o wide: every column)
and JSON or YAML for scripts (-o json, -o yaml). It also runs the control plane: dev (a development server with
simulated nodes), serve (the real thing, in any process mode) and sim (simulated nodes).

Where calls go: --server and --api-key, else $BETTER_COMPUTE_URL and $BETTER_COMPUTE_API_KEY, else the
config file (--config, default ` + defaultConfigPath() + `: {"url": …, "apiKey": …}). A method's flags are
its input's fields (webhooks create --url is the webhook's URL); a field named as one of the CLI's own
flags is --input-NAME.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return p.load(cmd, configPath)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&p.URL, serverFlag, "", "the control plane's URL ($BETTER_COMPUTE_URL)")
	pf.StringVar(&p.APIKey, "api-key", "", "an API key ($BETTER_COMPUTE_API_KEY)")
	pf.StringVar(&configPath, "config", "", "config file")
	pf.StringVarP(&p.Output, "output", "o", "table", "table, wide (every column, nothing cut), json or yaml")
	// --url was the connection flag until a method's own --url (webhooks create's) shadowed it.
	// It stays as a hidden alias for the command lines written with it, where no method field
	// takes the name; silent, since a warning on stderr would mix with exec's remote stderr.
	pf.StringVar(&p.URL, legacyServerFlag, "", "")
	_ = pf.MarkHidden(legacyServerFlag)
	for _, g := range apiCommands(p) {
		if g.Name() == "events" {
			g.AddCommand(eventsWatchCmd(p))
		}
		if g.Name() == "audit" {
			g.AddCommand(auditVerifyCmd(p))
		}
		if g.Name() == "workflows" {
			g.AddCommand(workflowsWatchCmd(p))
		}
		if g.Name() == "fleet" { // commands of its own, in place of the table's
			g.RemoveCommand(g.Commands()...)
			g.AddCommand(fleetCmds(p)...)
		}
		if g.Name() == "releases" {
			g.AddCommand(releasesInitCmd(p), releasesSignCmd(p), releasesPushCmd(p))
		}
		if g.Name() == "rollouts" {
			g.AddCommand(rolloutsWatchCmd(p))
		}
		root.AddCommand(g)
	}
	root.AddCommand(devCmd(), serveCmd(), simCmd(p), iamCmd(p), mcpCmd(p), methodsCmd(p), callCmd(p), execCmd(p), consoleCmd(p))
	root.InitDefaultCompletionCmd()
	root.SetHelpCommand(helpCmd(root))
	usage.Strict(root)
	return root
}

// helpCmd is cobra's help command, except that a topic that names no command is a usage error
// (exit 2), not the root's help and success.
func helpCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 || target == root && len(args) > 0 {
				return usageError{Err: fmt.Errorf("unknown help topic %q: better-compute help lists the commands", strings.Join(args, " "))}
			}
			return target.Help()
		},
	}
}

// The connection flags. serverFlag names the control plane; no method's input field can take
// its name (bindFields gives such a field --input-NAME), so it is never shadowed.
const (
	serverFlag       = "server"
	legacyServerFlag = "url"
)

func (p *profile) load(cmd *cobra.Command, path string) error {
	if !slices.Contains(outputFormats, p.Output) {
		return usageError{Err: fmt.Errorf("-o %q: use %s", p.Output, strings.Join(outputFormats, ", "))}
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
	// Whether the root's own flag was given: a method's flag of the same name (webhooks create
	// --url) is the method's input, and says nothing about where the call goes.
	given := func(flags ...string) bool {
		for _, f := range flags {
			if cmd.Root().PersistentFlags().Changed(f) {
				return true
			}
		}
		return false
	}
	pick := func(env, fromFile string, dst *string, flags ...string) {
		if given(flags...) {
			return
		}
		if v := os.Getenv(env); v != "" {
			*dst = v
		} else if fromFile != "" {
			*dst = fromFile
		}
	}
	pick("BETTER_COMPUTE_URL", file.URL, &p.URL, serverFlag, legacyServerFlag)
	pick("BETTER_COMPUTE_API_KEY", file.APIKey, &p.APIKey, "api-key")
	return nil
}
