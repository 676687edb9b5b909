// Package helper is bcd's root helper: the few privileged actions of a node agent (CDI specs in
// the runtime's spec directories, MIG changes through NVML, GPU resets) carried out by a small
// process that runs as root, for a node agent that runs unprivileged (bcd helper; bcd node
// --helper). They travel over a local Unix socket as one JSON object a line, each request one of
// a fixed set of typed commands whose arguments the helper checks: there is no command that runs
// a program or writes a file the caller names. The helper serves only the uid it is told to
// (SO_PEERCRED), and writes specs only in the directories it is given, only specs bcd itself
// would write (cdi.SpecPolicy). docs/bcd.md ("The root helper") describes it.
package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
)

// ProtocolVersion is the helper protocol's version, answered by hello.
const ProtocolVersion = 1

// The commands, the whole of what a helper does.
const (
	OpHello      = "hello"       // what this helper serves: its spec directories, MIG, resets
	OpCDIWrite   = "cdi.write"   // write a holder's spec in a spec directory (checked by cdi.SpecPolicy)
	OpCDIRemove  = "cdi.remove"  // remove a holder's spec
	OpCDIList    = "cdi.list"    // the spec files bcd wrote in a spec directory
	OpMIGState   = "mig.state"   // a GPU's MIG mode, profiles and instances
	OpMIGSetMode = "mig.setMode" // enable or disable MIG mode on a GPU
	OpMIGCreate  = "mig.create"  // make a GPU instance of a profile at a start, with one compute instance
	OpMIGDestroy = "mig.destroy" // destroy a GPU instance and its compute instances
	OpGPUReset   = "gpu.reset"   // reset a GPU
)

// Ops lists the commands, for messages.
var Ops = []string{OpHello, OpCDIWrite, OpCDIRemove, OpCDIList, OpMIGState, OpMIGSetMode, OpMIGCreate, OpMIGDestroy, OpGPUReset}

// MaxLine bounds one request or answer.
const MaxLine = 1 << 20

// Request is one line a client sends.
type Request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Response is the line that answers a request: Result, or Error.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Error codes.
const (
	CodeUnknownCommand   = "unknown_command"
	CodeInvalidArgument  = "invalid_argument"
	CodeNotAllowed       = "not_allowed" // a uid, a directory outside the roots, a spec bcd would not write
	CodeUnavailable      = "unavailable" // the helper has no NVML (no MIG, no resets)
	CodeFailed           = "failed"      // the action itself failed
	CodeMIGResetRequired = "mig_reset_required"
	CodeNoMIGProfile     = "no_mig_profile"
	CodeMIGPlacement     = "mig_placement"
)

// Error is a refusal or a failure, as the helper answers it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return "bcd helper: " + e.Code + ": " + e.Message }

// Unwrap gives the MIG converger the hardware error it branches on.
func (e *Error) Unwrap() error {
	switch e.Code {
	case CodeMIGResetRequired:
		return hardware.ErrMIGResetRequired
	case CodeNoMIGProfile:
		return hardware.ErrNoMIGProfile
	case CodeMIGPlacement:
		return hardware.ErrMIGPlacement
	}
	return nil
}

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// codeOf is the code of an action's error: the MIG errors by kind, anything else failed.
func codeOf(err error) string {
	switch {
	case errors.Is(err, hardware.ErrMIGResetRequired):
		return CodeMIGResetRequired
	case errors.Is(err, hardware.ErrNoMIGProfile):
		return CodeNoMIGProfile
	case errors.Is(err, hardware.ErrMIGPlacement):
		return CodeMIGPlacement
	}
	return CodeFailed
}

// HelloResult is what hello answers.
type HelloResult struct {
	Version  int      `json:"version"`
	Ops      []string `json:"ops"`
	CDIRoots []string `json:"cdiRoots"`
	MIG      bool     `json:"mig"`   // mig.* work
	Reset    bool     `json:"reset"` // gpu.reset works
	// Why is why MIG or resets do not work, when they do not.
	Why string `json:"why,omitempty"`
}

// CDIWrite is the argument of cdi.write: the spec of Holder, in Dir (one of the helper's roots).
type CDIWrite struct {
	Dir    string          `json:"dir"`
	Holder string          `json:"holder"`
	Spec   json.RawMessage `json:"spec"`
}

// CDIRef is the argument of cdi.remove: Name, a spec file bcd wrote, in Dir.
type CDIRef struct {
	Dir  string `json:"dir"`
	Name string `json:"name"`
}

// CDIList is the argument of cdi.list.
type CDIList struct {
	Dir string `json:"dir"`
}

// CDINames is what cdi.list answers.
type CDINames struct {
	Names []string `json:"names"`
}

// GPU is the argument of mig.state and gpu.reset.
type GPU struct {
	GPU int `json:"gpu"`
}

// MIGMode is the argument of mig.setMode.
type MIGMode struct {
	GPU     int  `json:"gpu"`
	Enabled bool `json:"enabled"`
}

// MIGCreate is the argument of mig.create.
type MIGCreate struct {
	GPU     int    `json:"gpu"`
	Profile string `json:"profile"`
	Start   int    `json:"start"`
}

// MIGDestroy is the argument of mig.destroy.
type MIGDestroy struct {
	GPU int `json:"gpu"`
	GI  int `json:"gi"`
}

// MaxGPU bounds a GPU's index.
const MaxGPU = 63

var profileRE = regexp.MustCompile(`^[0-9]+g\.[0-9]+gb(\+me|\+gfx|-me|\+me\.all)?$`)

func checkGPU(gpu int) error {
	if gpu < 0 || gpu > MaxGPU {
		return errorf(CodeInvalidArgument, "gpu: %d is not a GPU index (0 to %d)", gpu, MaxGPU)
	}
	return nil
}

func (a GPU) check() error     { return checkGPU(a.GPU) }
func (a MIGMode) check() error { return checkGPU(a.GPU) }

func (a MIGCreate) check() error {
	switch {
	case !profileRE.MatchString(a.Profile):
		return errorf(CodeInvalidArgument, "profile: %q is not a MIG profile (3g.40gb)", a.Profile)
	case a.Start < 0 || a.Start > 7:
		return errorf(CodeInvalidArgument, "start: %d is not a placement start (0 to 7)", a.Start)
	}
	return checkGPU(a.GPU)
}

func (a MIGDestroy) check() error {
	if a.GI < 0 || a.GI > 63 {
		return errorf(CodeInvalidArgument, "gi: %d is not a GPU instance id", a.GI)
	}
	return checkGPU(a.GPU)
}

func (a CDIWrite) check() error { return checkHolder(a.Holder) }

func (a CDIList) check() error { return nil } // its directory is checked against the roots

func (a CDIRef) check() error {
	if !cdi.IsSpecName(a.Name) || filepath.Base(a.Name) != a.Name {
		return errorf(CodeNotAllowed, "name: %q is not a spec file bcd writes (better-compute-<holder>.json)", a.Name)
	}
	return nil
}

func checkHolder(h string) error {
	if err := cdi.CheckHolder(h); err != nil {
		return errorf(CodeInvalidArgument, "holder: %v", err)
	}
	return nil
}
