//go:build !linux

package pid1

import (
	"context"
	"errors"
	"io"
	"os"
)

var errNotLinux = errors.New("pid1: bcd init runs on Linux only")

// Linux is the machine's System; on other systems every call fails.
func Linux() System { return otherSystem{} }

type otherSystem struct{}

func (otherSystem) Mount(Mount) error                           { return errNotLinux }
func (otherSystem) OpenConsole() (io.WriteCloser, error)        { return nil, errNotLinux }
func (otherSystem) ReadFile(string) ([]byte, error)             { return nil, errNotLinux }
func (otherSystem) WriteFile(string, []byte) error              { return errNotLinux }
func (otherSystem) LoadModule(string) error                     { return errNotLinux }
func (otherSystem) Links() ([]Link, error)                      { return nil, errNotLinux }
func (otherSystem) LinkUp(string) error                         { return errNotLinux }
func (otherSystem) DHCP(context.Context, string) (Lease, error) { return Lease{}, errNotLinux }
func (otherSystem) Renew(context.Context, Lease) (Lease, error) { return Lease{}, errNotLinux }
func (otherSystem) Configure(Lease) error                       { return errNotLinux }
func (otherSystem) RandomReady() bool                           { return true }
func (otherSystem) Reap() int                                   { return 0 }
func notifyChildExit() chan os.Signal                           { return make(chan os.Signal) }
func stopNotify(chan os.Signal)                                 {}
