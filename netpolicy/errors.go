package netpolicy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// Describe summarises the error of an outbound call for the tenant who chose where it went: what
// failed (the name did not resolve, the connection was refused, a certificate not trusted, the
// policy refused the address), never the text of the error itself, which may carry the
// resolver's address, an address the name resolved to, or what the far end answered. The
// operator's log keeps the whole error (Detail).
func Describe(err error) string {
	var (
		refused *RefusedError
		opaque  *OpaqueError
		dns     *net.DNSError
		unknown x509.UnknownAuthorityError
		name    x509.HostnameError
		invalid x509.CertificateInvalidError
		record  tls.RecordHeaderError
		alert   tls.AlertError
		timeout interface{ Timeout() bool }
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &opaque):
		return opaque.Summary
	case errors.As(err, &refused):
		if refused.Host == "" {
			return refused.Error()
		}
		return "refused: the host " + refused.Error()
	case errors.As(err, &dns):
		if dns.IsNotFound {
			return "the host name does not resolve"
		}
		return "the host name could not be resolved"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &timeout) && timeout.Timeout():
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &unknown):
		return "the server's TLS certificate is not signed by an authority trusted here"
	case errors.As(err, &name):
		return "the server's TLS certificate is not valid for the host"
	case errors.As(err, &invalid):
		return "the server's TLS certificate is not valid (expired, not yet valid, or not for a server)"
	case errors.As(err, &record):
		return "the server does not speak TLS"
	case errors.As(err, &alert):
		return "the TLS handshake failed"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed before an answer"
	}
	return "the request failed"
}

// OpaqueError is an error whose text is a summary a tenant may read, of an error that may carry
// what only the operator may (a failed call's body, the resolver's address). errors.Is and
// errors.As see through it; Detail gives the whole, for the operator's log.
type OpaqueError struct {
	Summary string
	Err     error
}

// Opaque wraps err under summary (Describe(err) when empty); nil stays nil.
func Opaque(summary string, err error) error {
	if err == nil {
		return nil
	}
	if summary == "" {
		summary = Describe(err)
	}
	return &OpaqueError{Summary: summary, Err: err}
}

func (e *OpaqueError) Error() string { return e.Summary }
func (e *OpaqueError) Unwrap() error { return e.Err }

// Detail is err's text with, for the operator, what every OpaqueError in it keeps back.
func Detail(err error) string {
	if err == nil {
		return ""
	}
	var hidden []string
	var walk func(error)
	walk = func(e error) {
		if o, ok := e.(*OpaqueError); ok && o.Err != nil {
			hidden = append(hidden, o.Err.Error())
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			if w := u.Unwrap(); w != nil {
				walk(w)
			}
		case interface{ Unwrap() []error }:
			for _, w := range u.Unwrap() {
				walk(w)
			}
		}
	}
	walk(err)
	if len(hidden) == 0 {
		return err.Error()
	}
	return err.Error() + " [" + strings.Join(hidden, "; ") + "]"
}
