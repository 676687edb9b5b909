//go:build !linux

package ramdisk

func kexec(string, string, string) error { return errNotLinux }
func reboot() error                      { return errNotLinux }
func powerOff() error                    { return errNotLinux }
