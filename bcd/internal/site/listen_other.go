//go:build !linux

package site

import (
	"fmt"
	"syscall"
)

// bindToDevice needs Linux's SO_BINDTODEVICE: elsewhere, a site with an Interface listens only
// with ListenAnywhere.
func bindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(string, string, syscall.RawConn) error {
		return fmt.Errorf("binding to interface %s needs Linux (or ListenAnywhere)", dev)
	}
}
