package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/pid1"
)

// When the kernel starts bcd as a ramdisk's /init it gives it no subcommand: its arguments are
// "/init" and the words of the kernel command line the kernel did not take, if any. bcd as PID
// 1 under the name init is therefore bcd init, with those words after "--" as init's
// arguments. This runs before Main parses the command line.
func init() {
	if os.Getpid() == 1 && filepath.Base(os.Args[0]) == "init" && (len(os.Args) == 1 || os.Args[1] != "init") {
		os.Args = append([]string{os.Args[0], "init", "--"}, os.Args[1:]...)
	}
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
the kernel starts it as /init, without arguments.`,
		Args: cobra.ArbitraryArgs, // the kernel command line's words the kernel did not take
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Getpid() != 1 {
				return errors.New("init runs only as PID 1, the ramdisk's /init (it mounts filesystems and loads kernel modules); to run the ramdisk's agent on a running system, use bcd ramdisk")
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(s.LogLevel)); err != nil {
				level = slog.LevelInfo
			}
			in, err := pid1.New(pid1.Config{LogLevel: level})
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
