//go:build linux

package ramdisk

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// kexec loads kernel and initrd with kexec_file_load(2) and boots them with reboot(2)
// (LINUX_REBOOT_CMD_KEXEC). It returns only if that fails.
func kexec(kernel, initrd, cmdline string) error {
	k, err := os.Open(kernel)
	if err != nil {
		return err
	}
	defer k.Close()
	initrdFd, flags := -1, unix.KEXEC_FILE_NO_INITRAMFS
	if initrd != "" {
		i, err := os.Open(initrd)
		if err != nil {
			return err
		}
		defer i.Close()
		initrdFd, flags = int(i.Fd()), 0
	}
	if err := unix.KexecFileLoad(int(k.Fd()), initrdFd, cmdline, flags); err != nil {
		return fmt.Errorf("kexec_file_load: %w", err)
	}
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_KEXEC); err != nil {
		return fmt.Errorf("reboot(KEXEC): %w", err)
	}
	return fmt.Errorf("reboot(KEXEC) returned without booting")
}

// reboot restarts the machine after syncing.
func reboot() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

// powerOff powers the machine off after syncing.
func powerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
