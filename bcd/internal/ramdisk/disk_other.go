//go:build !linux

package ramdisk

import (
	"errors"
	"os"
)

// The ramdisk runs on Linux; elsewhere the package builds, and disks are regular files.

var errNotLinux = errors.New("not supported outside Linux")

func discard(*os.File, int64, int64) error   { return errNotLinux }
func rereadPartitions(*os.File) error        { return nil }
func dropCache(*os.File, int64, int64) error { return nil }
func isBusy(error) bool                      { return false }
