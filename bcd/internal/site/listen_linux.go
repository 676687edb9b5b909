package site

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// bindToDevice is a listener's Control that binds its socket to an interface (SO_BINDTODEVICE):
// it receives only what arrives on that interface.
func bindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.BindToDevice(int(fd), dev) }); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("binding to interface %s: %w", dev, err)
		}
		return nil
	}
}
