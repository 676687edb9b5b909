package tpmattest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Open opens the TPM at where: a device path (/dev/tpmrm0, the kernel's resource manager, which
// flushes what a process leaves behind) or the host:port of a TPM that speaks raw TPM 2.0
// commands over TCP, as swtpm's --server type=tcp does.
func Open(where string) (io.ReadWriteCloser, error) {
	if strings.HasPrefix(where, "/") {
		f, err := os.OpenFile(where, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("tpm: open %s: %w", where, err)
		}
		return f, nil
	}
	if _, _, err := net.SplitHostPort(where); err != nil {
		return nil, fmt.Errorf("tpm: %q is neither a device path (/dev/tpmrm0) nor a host:port", where)
	}
	c, err := net.DialTimeout("tcp", where, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("tpm: connect to %s: %w", where, err)
	}
	return &stream{Conn: c}, nil
}

// stream frames a TCP connection to a TPM as a device reads: one Read returns one whole
// response, which go-tpm's transport expects (a response may arrive in pieces over TCP).
type stream struct {
	net.Conn
	pending []byte
}

// commandTimeout bounds one command over TCP: a TPM making an RSA primary key may take a while,
// but a TPM that never answers (swtpm busy with another client) must not hang the join.
const commandTimeout = 2 * time.Minute

func (s *stream) Write(p []byte) (int, error) {
	if err := s.Conn.SetDeadline(time.Now().Add(commandTimeout)); err != nil {
		return 0, err
	}
	return s.Conn.Write(p)
}

// maxResponse bounds a response read from the wire, well above any TPM's buffer.
const maxResponse = 64 << 10

func (s *stream) Read(p []byte) (int, error) {
	if len(s.pending) == 0 {
		hdr := make([]byte, 10) // tag, size, response code
		if _, err := io.ReadFull(s.Conn, hdr); err != nil {
			return 0, err
		}
		size := binary.BigEndian.Uint32(hdr[2:6])
		if size < 10 || size > maxResponse {
			return 0, fmt.Errorf("tpm: a response of %d bytes", size)
		}
		s.pending = make([]byte, size)
		copy(s.pending, hdr)
		if _, err := io.ReadFull(s.Conn, s.pending[10:]); err != nil {
			return 0, err
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}
