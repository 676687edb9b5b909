// Package api is the contract between Better Compute and everyone who calls it: the method table,
// the input and output types of every method, the closed list of error codes, pages and the
// idempotency key. The server (package compute), the typed client (package client), the CLI and
// the MCP tools are all driven by this one table, so a value is the same in-process and over HTTP.
//
// Start with methods.go: each entry is a Method[In, Out] (SitesCreate, ReservationsCreate, ...)
// naming its group, whether it mutates, its IAM action and resource. Inputs check themselves
// (Validate, and CheckInput for what every input must be); failures are *Error values with a Code
// (CodeOf, InvalidField), which callers branch on, never on the message. Version and surface.json
// are the surface's version, which a breaking change must bump (docs/compatibility.md).
//
// The package imports no database driver and no gRPC (an import test holds it to that), so a
// client links only this. docs/api.md describes the HTTP surface.
package api
