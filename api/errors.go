package api

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is the stable, closed list of error codes every Better Compute surface returns.
// Callers branch on the code, never on the message.
type Code string

// The error codes. The list is closed: a new code is an API change.
const (
	CodeInvalidArgument      Code = "invalid_argument"
	CodeUnauthenticated      Code = "unauthenticated"
	CodePermissionDenied     Code = "permission_denied"
	CodeNotFound             Code = "not_found"
	CodeConflict             Code = "conflict"
	CodeQuotaExceeded        Code = "quota_exceeded"
	CodeFailedPrecondition   Code = "failed_precondition"
	CodeConfirmationRequired Code = "confirmation_required"
	CodeUnavailable          Code = "unavailable"
	CodeInternal             Code = "internal"
)

// Codes lists every code, in the order of the list above.
var Codes = []Code{
	CodeInvalidArgument, CodeUnauthenticated, CodePermissionDenied, CodeNotFound, CodeConflict,
	CodeQuotaExceeded, CodeFailedPrecondition, CodeConfirmationRequired, CodeUnavailable, CodeInternal,
}

// HTTPStatus is the status code the HTTP envelope answers with for c.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict:
		return http.StatusConflict
	case CodeQuotaExceeded:
		return http.StatusTooManyRequests
	case CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	case CodeConfirmationRequired:
		return http.StatusPreconditionRequired
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is the one error type of the API. On the wire it is
// {"error": {"code", "message", "details"}}.
type Error struct {
	Code    Code           `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

// Error implements error.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, &api.Error{Code: api.CodeNotFound}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == ""
}

// With returns a copy of e with the detail key set to value.
func (e *Error) With(key string, value any) *Error {
	c := *e
	c.Details = make(map[string]any, len(e.Details)+1)
	for k, v := range e.Details {
		c.Details[k] = v
	}
	c.Details[key] = value
	return &c
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// InvalidField returns an invalid_argument error that names the offending field.
func InvalidField(field, format string, args ...any) *Error {
	return &Error{
		Code:    CodeInvalidArgument,
		Message: field + ": " + fmt.Sprintf(format, args...),
		Details: map[string]any{"field": field},
	}
}

// CodeOf returns the code of err: the code of the *Error it wraps, or internal for any other error
// and "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorBody is the JSON envelope of an error answer.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// NotFound is the error for a resource that does not exist, or that the caller may not know
// exists: the two read the same.
func NotFound(kind, ref string) *Error {
	return &Error{Code: CodeNotFound, Message: fmt.Sprintf("%s %q not found", kind, ref),
		Details: map[string]any{"kind": kind, "ref": ref}}
}
