// Package app is bcd, the Better Compute daemon that runs on every server, as a function: the bcd
// command is app.Main(), and a host whose modules add command or desired-state kinds builds its
// own bcd as app.Main(its extensions...). It only ever dials out: to
// join (JoinService, over HTTPS), then to hold one session with a gateway (gRPC over mutual
// TLS). Its state is one journal file in its state directory.
//
//	bcd join --url https://compute.example.com --token bcjoin_…
//	bcd node
//	bcd status [--json]
//	bcd doctor
//	bcd sim --nodes 1000 --url … --token …
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/agent/ext"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/daemon"
	"github.com/better-compute/compute/bcd/internal/doctor"
	"github.com/better-compute/compute/bcd/internal/journal"
	"github.com/better-compute/compute/bcd/internal/selfupdate"
	"github.com/better-compute/compute/bcd/internal/sshd"
	"github.com/better-compute/compute/bcd/internal/tenancy"
	"github.com/better-compute/compute/internal/lib/selfstat"
	"github.com/better-compute/compute/internal/lib/tpmattest"
	"github.com/better-compute/compute/internal/lib/usage"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/sim"
)

// version is set at build time: -ldflags "-X github.com/better-compute/compute/bcd/app.version=v0.1.0".
var version = "dev"

// Main runs bcd's command line, with exts carrying out modules' command and desired-state kinds
// (in bcd node and bcd sim), and exits: 0, 1 for a failure, 2 for a mistake in the command line.
func Main(exts ...ext.Extension) {
	os.Exit(run(exts, pid1Args(os.Getpid(), os.Args), os.Stdout, os.Stderr))
}

// settings are bcd's configuration: defaults, then the config file, then flags.
type settings struct {
	StateDir string `json:"stateDir"`
	CDIDir   string `json:"cdiDir"`
	Gateway  string `json:"gateway,omitempty"`
	// Transport: auto (gRPC, falling back to a WebSocket where gRPC is blocked), grpc or websocket.
	Transport string          `json:"transport,omitempty"`
	LogLevel  string          `json:"logLevel,omitempty"`
	Fake      *daemon.Fake    `json:"fake,omitempty"`
	Timeout   time.Duration   `json:"-"`
	exts      []ext.Extension // the modules' node sides, from Main
}

const defaultConfig = "/etc/bcd/config.json"

func newRoot(exts []ext.Extension) *cobra.Command {
	s := &settings{StateDir: "/var/lib/bcd", CDIDir: "/var/run/cdi", LogLevel: "info", exts: exts}
	var configPath string
	root := &cobra.Command{
		Use:   "bcd",
		Short: "The Better Compute daemon: joins a server to a control plane and keeps its session",
		Long: `bcd runs on every server of a Better Compute fleet. It joins with a join token, then holds one
session with a gateway, over gRPC with mutual TLS (or a WebSocket where gRPC is blocked), dialing out
only: it reports inventory, health and command results, and converges on the devices its
reservations hold (CDI specs).

Settings come from flags, then the config file (--config, default ` + defaultConfig + `, a JSON
object with stateDir, cdiDir, gateway, transport, logLevel and fake {gpus, model, commandDelay}).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return loadConfig(cmd, configPath, s)
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&configPath, "config", "", "config file (default "+defaultConfig+" when it exists)")
	pf.StringVar(&s.StateDir, "state-dir", s.StateDir, "where the journal (identity, desired state, pending results) is kept")
	pf.StringVar(&s.LogLevel, "log-level", s.LogLevel, "debug, info, warn or error")
	root.AddCommand(joinCmd(s), nodeCmd(s), statusCmd(s), doctorCmd(s), versionCmd(), superviseCmd(s), simCmd(s), ramdiskCmd(s), siteCmd(s), initCmd(s), cgroupHookCmd(), helperCmd(s))
	usage.Strict(root)
	return root
}

// loadConfig fills s from the config file, for the flags not given on the command line.
func loadConfig(cmd *cobra.Command, path string, s *settings) error {
	explicit := path != ""
	if !explicit {
		path = defaultConfig
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return nil
	}
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var file settings
	if err := json.Unmarshal(b, &file); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	set := func(flag string, dst *string, v string) {
		if v != "" && !cmd.Flags().Changed(flag) {
			*dst = v
		}
	}
	set("state-dir", &s.StateDir, file.StateDir)
	set("log-level", &s.LogLevel, file.LogLevel)
	if f := cmd.Flags().Lookup("cdi-dir"); f != nil {
		set("cdi-dir", &s.CDIDir, file.CDIDir)
	}
	if f := cmd.Flags().Lookup("gateway"); f != nil {
		set("gateway", &s.Gateway, file.Gateway)
	}
	if f := cmd.Flags().Lookup("transport"); f != nil {
		set("transport", &s.Transport, file.Transport)
	}
	if file.Fake != nil && s.Fake == nil {
		s.Fake = file.Fake
	}
	return nil
}

func (s *settings) logger(w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.LogLevel)); err != nil {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

func signals() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func joinCmd(s *settings) *cobra.Command {
	var url, token, hostname, caHash, cmdline, authorizedKeys, tpm string
	var rejoin bool
	c := &cobra.Command{
		Use:   "join --url URL --token TOKEN",
		Short: "Join this server to a control plane with a join token",
		Long: `join makes the node's private key (it never leaves this machine), sends a certificate request and
the machine's facts with the join token, and keeps the identity it gets back in the journal. The
token may also come from $BCD_JOIN_TOKEN.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmdline != "" {
				if err := fromCmdline(cmdline, authorizedKeys, &url, &token, &hostname, &caHash); err != nil {
					return err
				}
			}
			if token == "" {
				token = os.Getenv("BCD_JOIN_TOKEN")
			}
			if url == "" || token == "" {
				return usageError{Err: errors.New("join needs --url (the control plane's API URL) and --token (or $BCD_JOIN_TOKEN)")}
			}
			j, err := journal.Open(s.StateDir)
			if err != nil {
				return err
			}
			defer j.Close()
			var secret []byte
			if id, ok, _ := j.Identity(); ok {
				if !rejoin {
					return fmt.Errorf("this node already joined as %s (%s); to join it again (e.g. its certificate expired), run bcd join --rejoin", id.NodeName, id.NodeID)
				}
				secret = id.TakeoverSecret
				if hostname == "" {
					hostname = id.NodeName
				}
			}
			if hostname == "" {
				hostname, _ = os.Hostname()
			}
			if caHash == "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "bcd: warning: no --ca-hash; the machine CA the server sends is trusted unchecked (the join token's answer prints the hash)")
			}
			ctx, cancel := signals()
			defer cancel()
			o := nodeagent.JoinOptions{URL: url, Token: token, CAHash: caHash, TakeoverSecret: secret,
				Facts:  &agentv1.MachineFacts{Hostname: hostname, MachineId: machineID(), Os: "linux", Arch: runtime.GOARCH, AgentVersion: version},
				Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))}
			if tpm != "" {
				o.TPM = func() (io.ReadWriteCloser, error) { return tpmattest.Open(tpm) }
			}
			id, err := nodeagent.JoinWith(ctx, o)
			if err != nil {
				return err
			}
			if err := j.SetIdentity(id); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "joined as %s (%s); certificate valid until %s\nnow run: %s\n", id.NodeName, id.NodeID, id.NotAfter.Format(time.RFC3339), nextStep(cmd))
			return nil
		},
	}
	c.Flags().StringVar(&url, "url", "", "the control plane's API URL, e.g. https://compute.example.com")
	c.Flags().StringVar(&token, "token", "", "the join token (bcjoin_…)")
	c.Flags().StringVar(&hostname, "hostname", "", "the node's name (default: the machine's hostname)")
	c.Flags().StringVar(&caHash, "ca-hash", "", "the machine CA's pin, sha256:… as printed with the join token; the join is refused if the server's CA differs")
	c.Flags().BoolVar(&rejoin, "rejoin", false, "join again as the node this journal holds, proving it with the journal's takeover secret")
	c.Flags().StringVar(&tpm, "tpm", "", "attest the join with this machine's TPM: a device (/dev/tpmrm0) or a TPM's host:port (swtpm --server type=tcp); a pool may require it")
	c.Flags().StringVar(&cmdline, "cmdline", "", "a deployed system's kernel command line (/proc/cmdline): bcd.url=, bcd.join= and bcd.hostname= fill the flags not given, and bcd.ssh_keys= is written to --authorized-keys")
	c.Flags().StringVar(&authorizedKeys, "authorized-keys", "/root/.ssh/authorized_keys", "where --cmdline writes the SSH keys a lease hands the machine over to")
	return c
}

func nodeCmd(s *settings) *cobra.Command {
	var fakeGPUs int
	var fakeModel string
	var fakeDelay time.Duration
	var sshdDir, sshUser, helperSocket, home, devRoot string
	var execOK, hidepid bool
	var consoles []string
	var vm vmHostFlags
	update := selfUpdateFlags{enabled: true, deadline: selfupdate.DefaultDeadline}
	c := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: the session, inventory, health, CDI device holds and commands",
		Long: `node holds the session with a gateway until stopped (SIGINT or SIGTERM), reconnecting with jittered
backoff. GPUs are read through NVML; without it the node still runs and offers no GPUs (bcd status
and bcd doctor say why). --fake-gpus runs on simulated hardware instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fakeGPUs > 0 || cmd.Flags().Changed("fake-gpus") {
				s.Fake = &daemon.Fake{GPUs: fakeGPUs, Model: fakeModel, CommandDelay: fakeDelay}
			}
			cons, err := parseConsoles(consoles)
			if err != nil {
				return err
			}
			exts := s.exts
			ctx, cancel := signals()
			defer cancel()
			logger := s.logger(cmd.ErrOrStderr())
			holders, err := tenants(ctx, s, logger, execOK || sshdDir != "", helperSocket, home, devRoot, hidepid)
			if err != nil {
				return err
			}
			if sshdDir != "" {
				var userOf func(string) (string, bool)
				if holders != nil {
					userOf = holders.UserOf
				}
				conv, err := sshd.New(sshdDir, sshUser, userOf)
				if err != nil {
					return err
				}
				exts = append(exts, ext.Extension{Name: "ssh-access", Desired: map[string]ext.Converger{api.SSHAccessKind: conv.Apply}})
			}
			var reports *nodeagent.Reports
			if vm.runtime != "" {
				reports = nodeagent.NewReports()
				vmExt, stop, err := vm.start(ctx, s, reports, logger)
				if err != nil {
					return err
				}
				defer stop()
				exts = append(exts, vmExt)
			}
			ctx, restart := context.WithCancelCause(ctx)
			su, err := update.start(s.StateDir, logger, func(path string) { restart(restartInto{path}) })
			if err != nil {
				return err
			}
			err = daemon.Run(ctx, daemon.Config{StateDir: s.StateDir, CDIDir: s.CDIDir, Gateway: s.Gateway, Transport: s.Transport, Fake: s.Fake, Extensions: exts,
				Version: version, Logger: logger, Exec: execOK, Consoles: cons, Reports: reports, Helper: helperSocket, SelfUpdate: su,
				OnHardware: vm.sawHardware, Tenancy: holders, DeviceRoot: devRoot})
			var into restartInto
			if errors.As(context.Cause(ctx), &into) {
				return selfupdate.Exec(into.path)
			}
			return err
		},
	}
	update.flags(c)
	c.Flags().StringVar(&s.CDIDir, "cdi-dir", s.CDIDir, "where CDI specs of held devices are written")
	c.Flags().BoolVar(&execOK, "exec", false, "run the commands of holders' tunnels (access.exec): a holder of part of the node as its reservation's own user, "+
		"a holder of the whole node or an operator as the user bcd runs as (docs/access.md)")
	c.Flags().StringArrayVar(&consoles, "console", nil, "a console holders' tunnels may attach to (access.console), as name=unix:/path/to/socket; the name may be empty (the node's default); repeatable")
	c.Flags().StringVar(&s.Gateway, "gateway", "", "gateway address host:port (default: what the join gave)")
	transportFlag(c, s)
	c.Flags().IntVar(&fakeGPUs, "fake-gpus", 0, "simulate this many GPUs instead of reading NVML")
	c.Flags().StringVar(&fakeModel, "fake-model", "NVIDIA H100 80GB HBM3", "the simulated GPUs' name")
	c.Flags().DurationVar(&fakeDelay, "fake-command-delay", 0, "how long simulated commands take")
	c.Flags().StringVar(&sshdDir, "sshd-dir", "", "give the host's sshd the holders' SSH certificate access: CAs, principals and revocations are kept in this directory, with an sshd_config to Include (docs/access.md); empty: off")
	c.Flags().StringVar(&sshUser, "ssh-user", "root", "the operator login: the local user a holder of the whole node, and a break-glass certificate, log in as over SSH "+
		"(a holder of part of the node logs in as its reservation's own user)")
	c.Flags().StringVar(&home, "home", tenancy.DefaultHome, "where the homes of holders' own users are made (with --exec or --sshd-dir, as root)")
	c.Flags().BoolVar(&hidepid, "proc-hidepid", true, "with --exec or --sshd-dir, as root: remount /proc with hidepid=2, so that each holder sees its own processes alone")
	c.Flags().StringVar(&devRoot, "dev-root", tenancy.DefaultDeviceRoot, "where the GPUs' device nodes are")
	_ = c.Flags().MarkHidden("dev-root") // for tests with fake GPUs
	c.Flags().StringVar(&helperSocket, "helper", "", "run unprivileged: write CDI specs, change MIG and reset GPUs through the root helper listening on this socket (bcd helper; docs/bcd.md)")
	vm.flags(c)
	return c
}

// transportFlag adds --transport to a command that holds a session.
func transportFlag(c *cobra.Command, s *settings) {
	c.Flags().StringVar(&s.Transport, "transport", nodeagent.TransportAuto,
		"how the session reaches the gateway: auto (gRPC; a WebSocket on the same address when gRPC cannot connect), grpc or websocket")
}

func statusCmd(s *settings) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "Show the node's identity, session, generation, holds and pending results",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, running, err := daemon.ReadStatus(s.StateDir)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				e := json.NewEncoder(out)
				e.SetIndent("", "  ")
				return e.Encode(struct {
					daemon.Status
					Running bool `json:"running"`
				}{st, running})
			}
			w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			row := func(k string, v any) { fmt.Fprintf(w, "%s\t%v\n", k, v) }
			row("node", fmt.Sprintf("%s (%s)", st.NodeName, st.NodeID))
			if st.Version != "" {
				row("version", st.Version)
			}
			row("running", running)
			if running {
				session := "disconnected"
				if st.Connected {
					session = fmt.Sprintf("connected to %s over %s, epoch %d", st.Gateway, st.Transport, st.Epoch)
				}
				row("session", session)
				gpus := fmt.Sprint(st.GPUs)
				if st.GPUStatus != "" {
					gpus += " (" + st.GPUStatus + ")"
				}
				row("gpus", gpus)
				if st.LastError != "" {
					row("last error", st.LastError)
				}
				if u := st.Update; u != nil {
					if u.Wanted != "" {
						row("update", "installing "+u.Wanted+errSuffix(u.Error))
					}
					if t := u.Trial; t != nil {
						row("update trial", fmt.Sprintf("%s (from %s) until %s", t.Version, t.PreviousVersion, t.Deadline.Format(time.RFC3339)))
					}
					if u.Refused != "" {
						row("update refused", u.Refused)
					}
					if r := u.LastRollback; r != nil {
						row("last rollback", fmt.Sprintf("%s at %s: %s", r.Version, r.At.Format(time.RFC3339), r.Reason))
					}
				}
			}
			row("generation applied", st.AppliedGeneration)
			row("holds", st.Holds)
			row("pending results", st.PendingResults)
			row("certificate until", st.CertNotAfter.Format(time.RFC3339))
			return w.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func doctorCmd(s *settings) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check the clock, the certificate, the gateway, NVML, MIG, cgroup v2, the CDI directory and the disk",
		Long: `doctor checks what a node needs and says what to fix. It exits non-zero when a check fails.
With --json it prints a report of a stable shape: {"version": 1, "ok": bool, "checks": [{"name",
"status" (ok, warn, fail or skip), "detail", "fix", "data"}]}, the checks always in the same order.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := doctor.Options{StateDir: s.StateDir, CDIDir: s.CDIDir, Gateway: s.Gateway, Transport: s.Transport, SkipGPUs: s.Fake != nil}
			if st, running, err := daemon.ReadStatus(s.StateDir); err == nil && running {
				// A running node holds the journal; its status file stands in for it.
				o.Running = &doctor.Running{NodeID: st.NodeID, NodeName: st.NodeName, URL: st.URL, Gateway: st.Gateway, Transport: st.Transport,
					LastError: st.LastError, Connected: st.Connected, CertNotAfter: st.CertNotAfter}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			report := doctor.NewReport(doctor.Run(ctx, o))
			out := cmd.OutOrStdout()
			if asJSON {
				e := json.NewEncoder(out)
				e.SetIndent("", "  ")
				if err := e.Encode(report); err != nil {
					return err
				}
			} else {
				w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				for _, c := range report.Checks {
					fmt.Fprintf(w, "%s\t%s\t%s\n", strings.ToUpper(c.Status), c.Name, c.Detail)
					if c.Fix != "" {
						fmt.Fprintf(w, "\t\tfix: %s\n", c.Fix)
					}
				}
				w.Flush()
			}
			if !report.OK {
				return errors.New("some checks failed")
			}
			return nil
		},
	}
	c.Flags().StringVar(&s.CDIDir, "cdi-dir", s.CDIDir, "the CDI spec directory to check")
	c.Flags().StringVar(&s.Gateway, "gateway", "", "the gateway to check (default: what the join gave)")
	transportFlag(c, s)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print bcd's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			rev := ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, kv := range bi.Settings {
					if kv.Key == "vcs.revision" {
						rev = " (" + kv.Value + ")"
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "bcd %s%s %s\n", version, rev, bi.GoVersion)
				return
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bcd %s\n", version)
		},
	}
}

func simCmd(s *settings) *cobra.Command {
	o := sim.Options{Version: version, Extensions: s.exts}
	c := &cobra.Command{
		Use:   "sim --nodes N --url URL --token TOKEN",
		Short: "Run many node agents on fake hardware in one process, against a control plane",
		Long: `sim joins N simulated nodes with one join token (with at least N uses) and holds their sessions until
stopped; it prints how many are connected, and its CPU and memory, every ten seconds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.URL == "" || o.Token == "" || o.Nodes <= 0 {
				return usageError{Err: errors.New("sim needs --nodes, --url and --token")}
			}
			o.Logger = s.logger(cmd.ErrOrStderr())
			ctx, cancel := signals()
			defer cancel()
			start := time.Now()
			f, err := sim.Start(ctx, o)
			if err != nil {
				return err
			}
			defer f.Stop()
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "sim: %d nodes joined in %s\n", o.Nodes, time.Since(start).Round(time.Millisecond))
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			cpu0, t0 := selfstat.CPU(), time.Now()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
					up := 0
					for _, n := range f.Nodes {
						if n.Status().Connected {
							up++
						}
					}
					fmt.Fprintf(out, "sim: %d/%d connected; %.2f cores, %.0f MiB RSS\n", up, len(f.Nodes),
						(selfstat.CPU()-cpu0).Seconds()/time.Since(t0).Seconds(), selfstat.RSSMiB())
					cpu0, t0 = selfstat.CPU(), time.Now()
				}
			}
		},
	}
	c.Flags().IntVar(&o.Nodes, "nodes", 0, "how many nodes")
	c.Flags().StringVar(&o.URL, "url", "", "the control plane's API URL")
	c.Flags().StringVar(&o.Token, "token", "", "a join token with at least --nodes uses")
	c.Flags().StringVar(&o.Gateway, "gateway", "", "gateway address (default: what the joins gave)")
	c.Flags().IntVar(&o.GPUs, "gpus", 8, "GPUs per node")
	c.Flags().StringVar(&o.Prefix, "prefix", "sim", "node names are <prefix>-<n>")
	return c
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (last attempt: " + e + ")"
}

// parseConsoles reads --console values: name=unix:/path.
func parseConsoles(vals []string) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range vals {
		name, target, ok := strings.Cut(v, "=")
		path, unix := strings.CutPrefix(target, "unix:")
		if !ok || !unix || !filepath.IsAbs(path) {
			return nil, fmt.Errorf("--console %q: want name=unix:/absolute/path/to/socket", v)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--console %q: the console %q is named twice", v, name)
		}
		out[name] = path
	}
	return out, nil
}
