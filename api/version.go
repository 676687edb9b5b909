package api

// Version is the version of the API's surface: its methods (names, whether they mutate, their
// IAM action and resource) and the JSON of their inputs and outputs, modules' methods included.
// It changes only with a change that breaks a client of the previous version: a method removed,
// a field removed, renamed or of another type, a method's mutating flag, action or resource
// changed. Additions (a method, a field) keep it. api/surface.json is the surface at this
// version; TestAPISurface (internal/tools/surface) fails CI when the surface changes without the
// snapshot, and `go run ./internal/tools/cmd/surface` refuses to record a breaking change without a
// new Version (docs/compatibility.md).
const Version = 1
