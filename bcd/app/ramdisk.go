package app

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/ramdisk"
	"github.com/better-compute/compute/metal/siteapi"
)

func ramdiskCmd(s *settings) *cobra.Command {
	var cmdline string
	c := &cobra.Command{
		Use:   "ramdisk",
		Short: "Run as a machine's ramdisk at its site: report it, wipe it, stream an image to it, boot it",
		Long: `ramdisk is what a machine runs after it PXE-boots into its site's ramdisk (docs/ramdisk.md). It
reads the site agent's URL, the boot's token and the machine's id from the kernel command line
(bcd.site=, bcd.token=, bcd.machine=), says hello with the machine's facts, and carries out the
tasks the site gives it: wipe the disks, stream an image and verify its SHA-256, then kexec
the deployed system (with the join credential the site hands this boot), reboot or power off.
It only ever talks to its site agent.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := os.ReadFile(cmdline)
			if err != nil {
				return fmt.Errorf("ramdisk: read the kernel command line: %w", err)
			}
			site, machine, token, err := ramdisk.ParseCmdline(string(b))
			if err != nil {
				return err
			}
			ctx, cancel := signals()
			defer cancel()
			return ramdisk.Run(ctx, ramdisk.Config{Site: site, Machine: machine, Token: token, Logger: s.logger(cmd.ErrOrStderr())})
		},
	}
	c.Flags().StringVar(&cmdline, "cmdline", "/proc/cmdline", "the kernel command line to read bcd.site=, bcd.token= and bcd.machine= from")
	return c
}

// fromCmdline fills a join's URL, token, hostname and CA pin from a deployed system's kernel
// command line (bcd.url=, bcd.join=, bcd.hostname=, bcd.ca_hash=, which a deploy puts there),
// where the flags left them empty, and writes its holder's SSH keys (bcd.ssh_keys=) to
// authorizedKeys.
func fromCmdline(path, authorizedKeys string, url, token, hostname, caHash *string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("join: read the kernel command line: %w", err)
	}
	return applyCmdline(string(b), authorizedKeys, url, token, hostname, caHash)
}

// applyCmdline is fromCmdline on the command line's text.
func applyCmdline(cmdline, authorizedKeys string, url, token, hostname, caHash *string) error {
	p := siteapi.ParseCmdline(cmdline)
	for dst, name := range map[*string]string{url: siteapi.CmdlineJoinURL, token: siteapi.CmdlineJoin, hostname: siteapi.CmdlineHostname,
		caHash: siteapi.CmdlineCAHash} {
		if *dst == "" {
			*dst = p[name]
		}
	}
	raw, ok := p[siteapi.CmdlineSSHKeys]
	if !ok {
		return nil
	}
	var keys []string
	if b, err := base64.RawURLEncoding.DecodeString(raw); err != nil || json.Unmarshal(b, &keys) != nil {
		return errors.New("join: bcd.ssh_keys= on the kernel command line is not base64url of a JSON list of keys")
	}
	for _, k := range keys {
		if strings.ContainsAny(k, "\r\n") {
			return errors.New("join: an SSH key on the kernel command line spans lines")
		}
	}
	if err := os.MkdirAll(filepath.Dir(authorizedKeys), 0o700); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return os.WriteFile(authorizedKeys, []byte(strings.Join(keys, "\n")+"\n"), 0o600)
}
