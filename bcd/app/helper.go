package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/helper"
)

// helperCmd is bcd's root helper: the privileged actions of a node agent that runs
// unprivileged (bcd node --helper), over a Unix socket, for one uid.
func helperCmd(s *settings) *cobra.Command {
	var socket, hook string
	var roots []string
	allowUID, fakeGPUs := -1, 0
	c := &cobra.Command{
		Use:   "helper --socket PATH --allow-uid N",
		Short: "Run the root helper: CDI specs, MIG changes and GPU resets for an unprivileged bcd node",
		Long: `helper runs as root beside a node agent that does not (bcd node --helper PATH). It listens on a
Unix socket and carries out a fixed set of typed commands, for processes of the one uid --allow-uid
names (checked with SO_PEERCRED): write, list and remove the CDI specs of holds in the spec
directories --cdi-root names (only specs bcd itself writes: its devices, NVIDIA's device files, its
cgroup-hook), make and destroy MIG instances and set MIG modes through NVML, and reset GPUs. There is
no command that runs a program or writes a file the caller names.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if socket == "" || allowUID < 0 {
				return usageError{Err: errors.New("helper needs --socket PATH and --allow-uid N (the uid bcd node runs as)")}
			}
			log := s.logger(cmd.ErrOrStderr())
			if os.Geteuid() != 0 {
				log.Warn("bcd helper: not running as root: writing to the runtime's spec directories, MIG and resets may fail")
			}
			if hook == "" {
				self, err := os.Executable()
				if err == nil {
					self, err = filepath.EvalSymlinks(self)
				}
				if err != nil {
					return fmt.Errorf("helper: its own binary, the only hook a spec may run: %w (give --hook)", err)
				}
				hook = self
			}
			cfg := helper.Config{AllowUID: allowUID, CDIRoots: roots, Policy: cdi.SpecPolicy{Hook: hook}, Logger: log}
			closeGPUs, err := helperGPUs(&cfg, fakeGPUs)
			if err != nil {
				return err
			}
			defer closeGPUs()
			srv, err := helper.New(cfg)
			if err != nil {
				return err
			}
			ln, err := helper.Listen(socket)
			if err != nil {
				return err
			}
			defer os.Remove(socket)
			ctx, cancel := signals()
			defer cancel()
			log.Info("bcd helper: serving", "socket", socket, "allowUID", allowUID, "cdiRoots", cfg.CDIRoots, "mig", cfg.MIG != nil, "reset", cfg.Reset != nil)
			return srv.Serve(ctx, ln)
		},
	}
	f := c.Flags()
	f.StringVar(&socket, "socket", "", "the Unix socket to listen on, e.g. /run/bcd/helper.sock")
	f.IntVar(&allowUID, "allow-uid", -1, "the uid whose processes may call: the user bcd node runs as")
	f.StringArrayVar(&roots, "cdi-root", nil, "a directory specs may be written in (repeatable; default /etc/cdi and /var/run/cdi): bcd node's --cdi-dir")
	f.StringVar(&hook, "hook", "", "the bcd binary a spec's cgroup hook may run (default: this binary)")
	f.IntVar(&fakeGPUs, "fake-gpus", 0, "serve this many simulated GPUs instead of NVML's (tests, demonstrations)")
	c.AddCommand(helperCallCmd())
	return c
}

// helperGPUs fills cfg's MIG and resets: NVML's, or fake GPUs'.
func helperGPUs(cfg *helper.Config, fake int) (func(), error) {
	if fake > 0 {
		cfg.MIG = hardware.NewFakeMIG(fake)
		var mu sync.Mutex
		resets := map[int]int{}
		cfg.Reset = func(_ context.Context, gpu int) error {
			if gpu >= fake {
				return fmt.Errorf("this machine has no GPU %d (it has %d fake GPUs)", gpu, fake)
			}
			mu.Lock()
			resets[gpu]++
			n := resets[gpu]
			mu.Unlock()
			cfg.Logger.Info("bcd helper: fake GPU reset", "gpu", gpu, "resets", n)
			return nil
		}
		return func() {}, nil
	}
	gpus, err := hardware.OpenSystemGPUs()
	if err != nil {
		return nil, err
	}
	closeFn := func() {}
	if c, ok := gpus.(interface{ Close() }); ok {
		closeFn = c.Close
	}
	if m, ok := gpus.(hardware.MIG); ok {
		machine := &hardware.Machine{GPUs: gpus}
		cfg.MIG, cfg.Reset = m, machine.ResetGPU
	} else {
		_, cfg.Why = gpus.Inventory()
	}
	return closeFn, nil
}

// helperCallCmd sends one command to a helper: to check a setup (bcd helper call hello) from
// the agent's user.
func helperCallCmd() *cobra.Command {
	var socket string
	c := &cobra.Command{
		Use:   "call --socket PATH COMMAND [ARGS-JSON]",
		Short: "Send one command to a root helper and print its answer (e.g. hello, from the node agent's user)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if socket == "" {
				return usageError{Err: errors.New("call needs --socket PATH")}
			}
			var in any
			if len(args) == 2 {
				in = json.RawMessage(args[1])
			}
			cl := helper.NewClient(socket)
			defer cl.Close()
			var out json.RawMessage
			if err := cl.Call(cmd.Context(), args[0], in, &out); err != nil {
				return err
			}
			if len(out) == 0 {
				out = json.RawMessage("{}")
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return err
		},
	}
	c.Flags().StringVar(&socket, "socket", "", "the helper's socket")
	return c
}
