package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
)

// report prints a failed command's error and returns its exit code. With -o json (or yaml) the
// error is the API's envelope, {"error": {"code", "message", "details"}}, on stderr like every error (so
// stdout holds only answers); a usage error is invalid_argument with details.reason "usage" (or
// the decoder's details, for --json input the API would refuse too), a call that got no answer
// is unavailable. As text: "better-compute: code: message", and the
// field a bad input names.
func report(w io.Writer, format string, err error) int {
	e, code := describe(err)
	if structured(format) {
		if werr := writeValue(w, format, map[string]any{"error": e}); werr == nil {
			return code
		}
	}
	switch {
	case code == exitUsage && e.Details["field"] == nil:
		fmt.Fprintf(w, "better-compute: %s\n", clean(e.Message))
	default:
		fmt.Fprintf(w, "better-compute: %s: %s\n", clean(string(e.Code)), clean(e.Message))
	}
	if f, ok := e.Details["field"]; ok {
		fmt.Fprintf(w, "  field: %s\n", clean(fmt.Sprint(f)))
	}
	if code == exitUsage {
		fmt.Fprintln(w, "  (add --help for usage)")
	}
	return code
}

// describe is err as an API error, and the exit code it gets.
func describe(err error) (*api.Error, int) {
	var ue usageError
	var ae *api.Error
	switch {
	case errors.As(err, &ue) && errors.As(err, &ae):
		return ae, exitUsage // input that did not decode: what the API would answer for it
	case errors.As(err, &ue):
		return &api.Error{Code: api.CodeInvalidArgument, Message: err.Error(), Details: map[string]any{"reason": "usage"}}, exitUsage
	case errors.As(err, &ae):
		return ae, exitError
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrTunnelLost) {
		return &api.Error{Code: api.CodeUnavailable, Message: err.Error()}, exitError
	}
	return &api.Error{Code: api.CodeInternal, Message: err.Error()}, exitError
}
