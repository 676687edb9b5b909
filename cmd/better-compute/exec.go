package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// remoteExit is a tunnel's command that exited non-zero: the CLI exits with its code, having
// printed nothing of its own.
type remoteExit struct{ code int }

func (e remoteExit) Error() string { return fmt.Sprintf("the command exited %d", e.code) }

// exitTunnelLost is the exit code of a tunnel that ended without its command's exit (as ssh's).
const exitTunnelLost = 255

// detachKey ends a console session from the keyboard: Ctrl-], as virsh console and telnet.
const detachKey = 0x1d

// tunnelFlags are the flags naming a tunnel's node.
func tunnelFlags(c *cobra.Command, in *api.OpenTunnel) {
	f := c.Flags()
	f.StringVar(&in.Reservation, "reservation", "", "as the holder of this reservation, on a node it holds (with --node: that one)")
	f.StringVar(&in.Node, "node", "", "the node (its id, or its name with --pool)")
	f.StringVar(&in.Pool, "pool", "", "the pool of a node named by name")
	f.StringVar(&in.TenantID, "tenant-id", "", "the tenant (default: the key's)")
	f.BoolVar(&in.BreakGlass, "break-glass", false, "as an operator of the node, as root over its holders' work (needs --reason; docs/access.md)")
	f.StringVar(&in.Reason, "reason", "", "why, for break-glass (an access.break_glass event)")
}

// execCmd runs a command on a node over its session: better-compute exec.
func execCmd(p *profile) *cobra.Command {
	var in api.OpenTunnel
	c := &cobra.Command{
		Use:   "exec (--reservation R | --node N) [-t] -- COMMAND [ARG...]",
		Short: "Run a command on a node over its session, as ssh would: its output here, its exit code the CLI's",
		Long: `exec asks for a ticket (access.exec) and runs COMMAND on the node over its session (the node runs
bcd node --exec): standard input goes to it, its standard output and error come back, and the CLI exits
with its exit code (255 if the tunnel ended without one, as when the reservation no longer holds the
node). -t runs it in a pseudo-terminal the size of this one.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Command = args
			return runTunnel(cmd, p, in, false, nil)
		},
	}
	tunnelFlags(c, &in)
	c.Flags().BoolVarP(&in.TTY, "tty", "t", false, "run the command in a pseudo-terminal (this terminal goes raw while it runs)")
	return c
}

// consoleCmd attaches to a node's console: better-compute console.
func consoleCmd(p *profile) *cobra.Command {
	var in api.OpenTunnel
	var instance, sandbox string
	c := &cobra.Command{
		Use:   "console (--reservation R | --node N) [--console NAME] | --instance I | --sandbox S",
		Short: "Attach to a node's console, or a VM's, over its session; Ctrl-] detaches",
		Long: `console asks for a ticket (access.console) and attaches this terminal to the node's console (one
bcd node --console names): what you type goes to it, what it prints comes here. Ctrl-] detaches.
With --instance or --sandbox it attaches to that VM's serial console instead, with a ticket of the
vps module's instances.console or sandboxes.console (which check that the VM is yours).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if instance == "" && sandbox == "" {
				return runTunnel(cmd, p, in, true, nil)
			}
			// A VM's console is found by the module from the VM alone: a node's flags beside it
			// would be ignored, so they are refused.
			var given []string
			for _, name := range []string{"instance", "sandbox", "reservation", "node", "pool", "console", "break-glass", "reason"} {
				if cmd.Flags().Changed(name) {
					given = append(given, "--"+name)
				}
			}
			if len(given) > 1 {
				return usageError{Err: fmt.Errorf("%s: give one (--instance or --sandbox names a VM alone)", strings.Join(given, ", "))}
			}
			method, ref := "instances.console", map[string]string{"instance": instance}
			if sandbox != "" {
				method, ref = "sandboxes.console", map[string]string{"sandbox": sandbox}
			}
			if in.TenantID != "" {
				ref["tenantId"] = in.TenantID
			}
			return runTunnel(cmd, p, in, true, moduleConsole(method, ref))
		},
	}
	tunnelFlags(c, &in)
	c.Flags().StringVar(&in.Console, "console", "", "which console (default: the node's)")
	c.Flags().StringVar(&instance, "instance", "", "a VM's serial console: the vps instance (its name or id)")
	c.Flags().StringVar(&sandbox, "sandbox", "", "a sandbox's serial console (its name or id)")
	return c
}

// moduleConsole opens a console by a module's method that answers a ticket (instances.console).
func moduleConsole(method string, input any) func(context.Context, *client.Client) (*client.Tunnel, error) {
	return func(ctx context.Context, cl *client.Client) (*client.Tunnel, error) {
		ms, err := cl.Methods(ctx)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(ms, func(m api.MethodDescription) bool { return m.FullName() == method })
		if i < 0 {
			return nil, fmt.Errorf("the control plane serves no method %s (is the vps module in?)", method)
		}
		out, err := cl.Do(ctx, ms[i].MethodInfo, input)
		if err != nil {
			return nil, err
		}
		var ticket api.TunnelTicket
		if err := json.Unmarshal(out, &ticket); err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		return cl.OpenTunnel(ctx, ticket)
	}
}

// runTunnel opens a tunnel (access.exec or access.console with in, or else by openBy) and carries
// this terminal over it.
func runTunnel(cmd *cobra.Command, p *profile, in api.OpenTunnel, console bool, openBy func(context.Context, *client.Client) (*client.Tunnel, error)) error {
	cl, err := serverClient(p)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stdin, stdout := cmd.InOrStdin(), cmd.OutOrStdout()
	f, isFile := stdin.(*os.File)
	raw := isFile && term.IsTerminal(int(f.Fd())) && (console || in.TTY)
	if raw {
		if in.Cols, in.Rows, err = term.GetSize(int(f.Fd())); err != nil {
			return err
		}
		stop() // in raw mode ^C is a byte for the far end, not a signal here
		ctx = cmd.Context()
	}
	open := cl.Exec
	if console {
		open = cl.Console
	}
	var t *client.Tunnel
	if openBy != nil {
		t, err = openBy(ctx, cl)
	} else {
		t, err = open(ctx, in)
	}
	if err != nil {
		return err
	}
	defer t.Close()
	restore := func() {}
	if raw {
		state, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return err
		}
		restore = func() { _ = term.Restore(int(f.Fd()), state) }
		defer restore()
		go followSize(ctx, t, int(f.Fd()))
	}
	var e api.TunnelExit
	if console {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			// Ctrl-] detaches: the console goes on without us. The end of standard input does
			// not: the console's output is followed until it ends, Ctrl-] or a signal.
			_, _ = io.Copy(t, detacher{r: stdin, detach: cancel})
		}()
		e, err = t.Wait(ctx, stdout, nil)
		if ctx.Err() != nil {
			return nil // detached, or interrupted
		}
	} else {
		e, err = t.Run(ctx, stdin, stdout, cmd.ErrOrStderr())
	}
	switch {
	case err != nil:
		return err
	case e.Error != "":
		// The tunnel ended without the command's exit, or the console with an error (none
		// there, the node's session gone): say why, and exit 255 as ssh does.
		restore()
		fmt.Fprintf(cmd.ErrOrStderr(), "better-compute: the tunnel ended: %s\n", clean(e.Error))
		return remoteExit{exitTunnelLost}
	case e.ExitCode != 0:
		return remoteExit{e.ExitCode}
	}
	return nil
}

// followSize tells the tunnel this terminal's size whenever it changes.
func followSize(ctx context.Context, t *client.Tunnel, fd int) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
			if cols, rows, err := term.GetSize(fd); err == nil {
				_ = t.Resize(ctx, cols, rows)
			}
		}
	}
}

// detacher reads r until the detach key.
type detacher struct {
	r      io.Reader
	detach func()
}

var errDetached = errors.New("detached")

func (d detacher) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if i := bytes.IndexByte(p[:n], detachKey); i >= 0 {
		d.detach()
		return i, errDetached
	}
	return n, err
}
