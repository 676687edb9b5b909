// Package compat holds the tests of version skew and upgrades (docs/compatibility.md): bcd
// built from older commits of this repository against the control plane of this tree; this
// bcd against an older control plane; a database upgraded in place while an older and a newer
// control plane serve it; and agents and gateways that meet messages and fields newer than
// they are. It has no code of its own.
package compat
