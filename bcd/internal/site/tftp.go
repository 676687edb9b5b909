package site

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pin/tftp/v3"
)

// tftpServer serves the iPXE binaries, read-only.
type tftpServer = tftp.Server

// TFTP's patience with a client that stops acknowledging: bounded, so that Run's shutdown,
// which waits for transfers in flight, is too.
const (
	tftpTimeout = 2 * time.Second
	tftpRetries = 3
)

func (s *Server) newTFTPServer() *tftpServer {
	t := tftp.NewServer(s.tftpRead, nil) // nil: write requests are refused
	t.SetTimeout(tftpTimeout)
	t.SetRetries(tftpRetries)
	return t
}

// tftpRead sends one of the iPXE binaries; any other name is refused, so no path reaches
// outside IPXEDir.
func (s *Server) tftpRead(name string, rf io.ReaderFrom) error {
	file, err := ipxeBinary(name)
	if err != nil {
		s.log.Warn("tftp: refused", "file", name, "err", err)
		return err
	}
	f, err := os.Open(filepath.Join(s.cfg.IPXEDir, file))
	if err != nil {
		s.log.Error("tftp: iPXE binary missing", "file", file, "err", err)
		return fmt.Errorf("%s is not available", file)
	}
	defer f.Close()
	n, err := rf.ReadFrom(f) // *os.File seeks: the transfer size (tsize) is told
	if err != nil {
		s.log.Warn("tftp: transfer failed", "file", file, "err", err)
		return err
	}
	s.log.Info("tftp: sent", "file", file, "bytes", n)
	return nil
}

// ipxeBinary maps a requested name to an iPXE binary this site serves ("/undionly.kpxe" as
// some firmware asks is the same file).
func ipxeBinary(name string) (string, error) {
	n := strings.TrimPrefix(name, "/")
	switch n {
	case BIOSBinary, EFIBinaryIPXE, EFIBinarySNP:
		return n, nil
	}
	return "", fmt.Errorf("%q is not an iPXE binary this site serves (%s, %s, %s)", name, BIOSBinary, EFIBinaryIPXE, EFIBinarySNP)
}
