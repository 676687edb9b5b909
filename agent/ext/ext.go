// Package ext is the node side of a module: the command kinds and desired-state kinds that bcd
// (and the simulated node) carry out for it. A module registers a kind with the control plane
// (modules.Registry.CommandKind, DesiredKind); the node runs it through an Extension given to its
// agent. Nothing here imports the control plane.
package ext

import (
	"context"
	"fmt"
	"regexp"
)

// Command carries out one command of a kind. args is the command's JSON object, decoded; the
// output (nil for none) is the command's result.
type Command func(ctx context.Context, args map[string]any) (output map[string]any, err error)

// secretKey carries a command's secret in its context.
type secretKey struct{}

// WithSecret returns ctx carrying a command's secret: the node's agent calls a Command so.
func WithSecret(ctx context.Context, secret []byte) context.Context {
	if len(secret) == 0 {
		return ctx
	}
	return context.WithValue(ctx, secretKey{}, secret)
}

// SecretOf returns the secret of the command being carried out (api.CreateCommand's write-only
// secret: a JSON object the control plane keeps sealed and sends only to this node), or nil when
// it has none. A command never returns it in its output.
func SecretOf(ctx context.Context) []byte {
	s, _ := ctx.Value(secretKey{}).([]byte)
	return s
}

// Reporter sends a report of a kind a module registered (modules.Registry.ReportKind) up the
// node's session. It returns once the control plane has recorded it, or with the reason it was
// refused, or when ctx ends (then it may or may not have been recorded: reports are handled at
// least once, so a handler must take one twice).
type Reporter interface {
	Report(ctx context.Context, kind string, payload any) error
}

// Converger applies one desired-state part: payload is the JSON the control plane sent, of the
// version given. It is called with every push of the node's desired state (the same part again,
// or a newer one), so it must converge, not append. A node whose state no longer has the part is
// given nil.
type Converger func(ctx context.Context, version uint32, payload []byte) error

// Extension is what one module adds to a node.
type Extension struct {
	Name     string
	Commands map[string]Command   // by command kind, e.g. "metal.ping"
	Desired  map[string]Converger // by desired-state kind, e.g. "vps.instances"
	// Console, if set, finds a console access.console may attach to (a VM's serial console) by
	// its name, for the reservation the ticket was made for ("" for an operator's): the Unix
	// socket to dial. It finds one only for the reservation that owns it, so that a tenant's
	// ticket never opens another's console. The node's own consoles (bcd node --console) come
	// first.
	Console func(name, reservation string) (socket string, ok bool)
}

var kindRE = regexp.MustCompile(`^[a-z][a-z0-9]*(\.[a-z][a-z0-9]*)+$`)

// Set is a node's extensions, checked: no kind claimed twice, none malformed.
type Set struct {
	commands map[string]Command
	desired  map[string]Converger
	consoles []func(string, string) (string, bool)
}

// NewSet checks exts and indexes their kinds.
func NewSet(exts ...Extension) (*Set, error) {
	s := &Set{commands: map[string]Command{}, desired: map[string]Converger{}}
	for _, e := range exts {
		for k, c := range e.Commands {
			if !kindRE.MatchString(k) || c == nil {
				return nil, fmt.Errorf("ext: extension %q: command kind %q needs a dotted lower-case name and a function", e.Name, k)
			}
			if _, dup := s.commands[k]; dup {
				return nil, fmt.Errorf("ext: command kind %s is claimed twice (extension %q)", k, e.Name)
			}
			s.commands[k] = c
		}
		if e.Console != nil {
			s.consoles = append(s.consoles, e.Console)
		}
		for k, c := range e.Desired {
			if !kindRE.MatchString(k) || c == nil {
				return nil, fmt.Errorf("ext: extension %q: desired-state kind %q needs a dotted lower-case name and a function", e.Name, k)
			}
			if _, dup := s.desired[k]; dup {
				return nil, fmt.Errorf("ext: desired-state kind %s is claimed twice (extension %q)", k, e.Name)
			}
			s.desired[k] = c
		}
	}
	return s, nil
}

// Command returns the runner of a command kind.
func (s *Set) Command(kind string) (Command, bool) {
	if s == nil {
		return nil, false
	}
	c, ok := s.commands[kind]
	return c, ok
}

// Console finds a console the extensions serve to reservation.
func (s *Set) Console(name, reservation string) (string, bool) {
	if s == nil {
		return "", false
	}
	for _, find := range s.consoles {
		if p, ok := find(name, reservation); ok {
			return p, true
		}
	}
	return "", false
}

// Converger returns the converger of a desired-state kind.
func (s *Set) Converger(kind string) (Converger, bool) {
	if s == nil {
		return nil, false
	}
	c, ok := s.desired[kind]
	return c, ok
}

// DesiredKinds returns the desired-state kinds the set converges.
func (s *Set) DesiredKinds() []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.desired))
	for k := range s.desired {
		out = append(out, k)
	}
	return out
}
