package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/daemon"
	"github.com/better-compute/compute/bcd/internal/journal"
	"github.com/better-compute/compute/bcd/internal/pid1"
	"github.com/better-compute/compute/bcd/internal/ramdisk"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/metal/siteapi"
)

// pid1Args returns the arguments bcd runs with: as given, except when the kernel started it as a
// ramdisk's /init, with no subcommand (its arguments are "/init" and the words of the kernel
// command line the kernel did not take): then it is bcd init, with those words after "--".
func pid1Args(pid int, args []string) []string {
	if pid == 1 && len(args) > 0 && filepath.Base(args[0]) == "init" && (len(args) == 1 || args[1] != "init") {
		return append([]string{"init", "--"}, args[1:]...)
	}
	return args[1:]
}

func initCmd(s *settings) *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "Run as a ramdisk's /init (PID 1): mount, load modules, configure the network by DHCP, run bcd ramdisk",
		Long: `init is bcd as the first process of the ramdisk mkramdisk builds (docs/ramdisk.md): it mounts
/proc, /sys, /dev, /tmp and /run, loads the kernel modules listed in /etc/bcd/modules in their order,
brings up lo and every NIC and configures the first DHCP lease given on any of them (address,
default route, /etc/resolv.conf), then runs bcd ramdisk with the kernel command line. It logs to
/dev/console and never exits: a step that fails is logged and tried again. It runs only as PID 1;
the kernel starts it as /init, without arguments.

Booted by a deploy with the image's kernel and this ramdisk (the command line then carries
bcd.join=, bcd.url= and bcd.hostname=), it is the deployed system's first process instead: it joins
its pool with the deploy's credential and runs bcd node.`,
		Args: cobra.ArbitraryArgs, // the kernel command line's words the kernel did not take
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Getpid() != 1 {
				return errors.New("init runs only as PID 1, the ramdisk's /init (it mounts filesystems and loads kernel modules); to run the ramdisk's agent on a running system, use bcd ramdisk")
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(s.LogLevel)); err != nil {
				level = slog.LevelInfo
			}
			in, err := pid1.New(pid1.Config{LogLevel: level, Ramdisk: func(ctx context.Context, cmdline string, log *slog.Logger) error {
				if _, deployed := siteapi.ParseCmdline(cmdline)[siteapi.CmdlineJoin]; deployed {
					return runDeployed(ctx, s, cmdline, log)
				}
				site, machine, token, err := ramdisk.ParseCmdline(cmdline)
				if err != nil {
					return err
				}
				return ramdisk.Run(ctx, ramdisk.Config{Site: site, Machine: machine, Token: token, Logger: log})
			}})
			if err == nil {
				err = in.Run(context.Background()) // returns only when its context ends: never
			}
			// PID 1 must not exit, or the kernel panics: say why, and stay.
			slog.Error("bcd init: stopped", "err", err, "args", args)
			for {
				time.Sleep(time.Hour)
			}
		},
	}
}

// The deployed system's state, in the initramfs it runs from.
const (
	deployedStateDir      = "/var/lib/bcd"
	deployedCDIDir        = "/run/cdi"
	deployedAuthorizedKey = "/root/.ssh/authorized_keys"
)

// runDeployed is a deployed system's init after the ramdisk's network: it joins with what its
// deploy put on the kernel command line (once: a restart of the step finds the identity in the
// journal), writes its lease holder's keys, then runs bcd node until ctx ends.
func runDeployed(ctx context.Context, s *settings, cmdline string, log *slog.Logger) error {
	var url, token, hostname, caHash string
	if err := applyCmdline(cmdline, deployedAuthorizedKey, &url, &token, &hostname, &caHash); err != nil {
		return err
	}
	j, err := journal.Open(deployedStateDir)
	if err != nil {
		return err
	}
	if _, ok, err := j.Identity(); err != nil || !ok {
		log.Info("bcd init: joining as the deployed system", "url", url, "hostname", hostname)
		var id nodeagent.Identity
		// The deploy's one-use credential reached the machine in the clear already; the pinned
		// CA keeps anyone on the path from answering for the control plane.
		id, err = nodeagent.JoinWith(ctx, nodeagent.JoinOptions{URL: url, Token: token, CAHash: caHash, PlainHTTP: true,
			Facts: &agentv1.MachineFacts{Hostname: hostname, MachineId: machineID(), Os: "linux", AgentVersion: version}})
		if err == nil {
			err = j.SetIdentity(id)
		}
		if err != nil {
			j.Close()
			return err
		}
	}
	j.Close()
	return daemon.Run(ctx, daemon.Config{StateDir: deployedStateDir, CDIDir: deployedCDIDir, Version: version, Logger: log, Extensions: s.exts})
}
