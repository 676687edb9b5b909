package modules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// What a module adds besides methods: command kinds and desired-state kinds that travel to bcd,
// IAM resource resolvers, event types, join credentials and report kinds. Each is refused when
// registered twice or malformed, in compute.New. Workflows, drivers and profiles are package
// provision's (workflow.go forwards to its Catalog).

// eventTypeRE is the form compute.events accepts.
var eventTypeRE = regexp.MustCompile(`^[a-z]+(\.[a-z_]+)+$`)

// CommandKind is a kind of one-shot command a node carries out (bcd's side: agent/ext).
type CommandKind struct {
	Name    string // e.g. gpu.reset
	Summary string
	// Check validates the arguments of a command for node (a JSON object, possibly {}) in the
	// transaction that queues it; an error it returns is the caller's (an *api.Error naming the
	// field). nil accepts any object.
	Check func(ctx context.Context, q postgres.Querier, nodeID string, args json.RawMessage) error
}

// DesiredKind is a part of a node's desired state a module owns. Its State travels to bcd as a
// versioned JSON payload beside the core's device holds, and the node's converger for the kind
// (agent/ext) applies it. A module moves the part with Nodes.BumpDesired.
type DesiredKind struct {
	Name    string // e.g. vps.instances
	Version uint32 // the payload's format; a node refuses a version it does not know
	// Optional parts are ignored by a node with no converger for them (SSH access on a node
	// that runs no sshd), where a part a node cannot converge otherwise fails its whole state.
	Optional bool
	// State returns the part for nodeID, or nil when the node has none of it.
	State func(ctx context.Context, q postgres.Querier, nodeID string) (any, error)
}

// ResolveFunc tells IAM the attributes of one resource (name, tenantId, labels.<key>, and those
// of its type), for policy conditions. A resource that does not exist has none: nil, nil.
type ResolveFunc func(ctx context.Context, q postgres.Querier, id string) (map[string]any, error)

// EventType is a kind of event a module emits.
type EventType struct {
	Name        string // e.g. reservation.preempted
	Description string
}

// CommandKind registers command kinds.
func (r *Registry) CommandKind(ks ...CommandKind) {
	for _, k := range ks {
		switch {
		case !api.ValidKind(k.Name):
			r.fail(fmt.Errorf("command kind %q: must be dotted lower-case words, e.g. gpu.reset", k.Name))
		case r.commands[k.Name] != nil:
			r.fail(fmt.Errorf("command kind %s is registered twice", k.Name))
		default:
			r.commands[k.Name] = &k
		}
	}
}

// DesiredKind registers desired-state kinds.
func (r *Registry) DesiredKind(ks ...DesiredKind) {
	for _, k := range ks {
		switch {
		case !api.ValidKind(k.Name):
			r.fail(fmt.Errorf("desired-state kind %q: must be dotted lower-case words, e.g. vps.instances", k.Name))
		case k.Version == 0 || k.State == nil:
			r.fail(fmt.Errorf("desired-state kind %s needs a version (from 1) and a State function", k.Name))
		case r.hasDesired(k.Name):
			r.fail(fmt.Errorf("desired-state kind %s is registered twice", k.Name))
		default:
			r.desired = append(r.desired, k)
		}
	}
}

func (r *Registry) hasDesired(name string) bool {
	for _, k := range r.desired {
		if k.Name == name {
			return true
		}
	}
	return false
}

// Resolver registers how IAM learns the attributes of resources of a type the module registered.
func (r *Registry) Resolver(resourceType string, fn ResolveFunc) {
	switch {
	case fn == nil:
		r.fail(fmt.Errorf("resolver of %s: nil function", resourceType))
	case r.resolvers[resourceType] != nil:
		r.fail(fmt.Errorf("resource type %s has two resolvers", resourceType))
	default:
		r.resolvers[resourceType] = fn
	}
}

// EventTypes registers event types. Events.Emit refuses a type nobody registered.
func (r *Registry) EventTypes(ts ...EventType) {
	for _, t := range ts {
		switch {
		case !eventTypeRE.MatchString(t.Name):
			r.fail(fmt.Errorf("event type %q: must be dotted lower-case words (letters and _), e.g. reservation.created", t.Name))
		case r.events[t.Name] != "":
			r.fail(fmt.Errorf("event type %s is registered twice", t.Name))
		default:
			r.events[t.Name] = r.module
			r.eventInfo = append(r.eventInfo, t)
		}
	}
}

// LookupCommandKind returns the registered command kind name.
func (r *Registry) LookupCommandKind(name string) (CommandKind, bool) {
	k := r.commands[name]
	if k == nil {
		return CommandKind{}, false
	}
	return *k, true
}

// CommandKinds returns the registered command kinds' names, sorted.
func (r *Registry) CommandKinds() []string {
	out := make([]string, 0, len(r.commands))
	for n := range r.commands {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// DesiredKinds returns the registered desired-state kinds, in registration order.
func (r *Registry) DesiredKinds() []DesiredKind {
	if r == nil {
		return nil
	}
	return r.desired
}

// LookupResolver returns the resolver of a resource type.
func (r *Registry) LookupResolver(resourceType string) (ResolveFunc, bool) {
	fn := r.resolvers[resourceType]
	return fn, fn != nil
}

// HasEventType reports whether some module registered the event type.
func (r *Registry) HasEventType(name string) bool { return r.events[name] != "" }

// EventTypeList returns the registered event types, sorted by name.
func (r *Registry) EventTypeList() []EventType {
	out := append([]EventType(nil), r.eventInfo...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// checkKinds verifies what refers to other registrations: resolvers to resource types.
func (r *Registry) checkKinds() []error {
	var errs []error
	types := make([]string, 0, len(r.resolvers))
	for t := range r.resolvers {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		if _, ok := r.types[t]; !ok {
			errs = append(errs, fmt.Errorf("modules: a resolver is registered for resource type %q, which no module registered", t))
		}
	}
	return errs
}

// ResolveRow reads the attributes of one resource from a row of (name, tenant, labels, other
// attributes as a JSON object): the usual ResolveFunc. No row is no resource: nil, nil.
func ResolveRow(row pgx.Row) (map[string]any, error) {
	var name, tenant string
	var labels map[string]string
	var extra map[string]any
	err := row.Scan(&name, &tenant, &labels, &extra)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	attrs := map[string]any{"name": name, "tenantId": tenant}
	for k, v := range labels {
		attrs["labels."+k] = v
	}
	for k, v := range extra {
		attrs[k] = v
	}
	return attrs, nil
}

// Admission is what a spent join credential admits: a machine into a pool of a tenant, or, when
// NodeID is set, only a machine taking over that node of the pool. Role is what the machine is
// admitted as: api.RoleNode (the default, "") or api.RoleSite, a site agent; it is written into
// the node's certificate and checked at every session.
type Admission struct {
	TenantID, PoolID string
	NodeID           string
	Role             string
}

// JoinCredential is a kind of credential a joining machine presents (joinTokens' "bcjoin_…", a
// module's own for machines it provisions), told apart by its prefix.
type JoinCredential struct {
	Prefix string // e.g. "bcjoin_"
	// Spend spends one use of credential in the join's transaction, or refuses it with a
	// *JoinRefused whose reason the machine may read (unknown, revoked, expired, used up). A
	// refused join changes nothing.
	Spend func(ctx context.Context, tx pgx.Tx, credential string) (Admission, error)
}

// JoinRefused is a join credential that was refused, not a failure of the server: the machine
// is told Reason.
type JoinRefused struct{ Reason string }

func (e *JoinRefused) Error() string { return "join refused: " + e.Reason }

// JoinCredentials registers kinds of join credential.
func (r *Registry) JoinCredentials(cs ...JoinCredential) {
	for _, c := range cs {
		switch {
		case len(c.Prefix) < 3 || c.Spend == nil:
			r.fail(fmt.Errorf("join credential %q: needs a prefix of 3 characters or more and a Spend function", c.Prefix))
		case r.joinCredentialFor(c.Prefix) != nil:
			r.fail(fmt.Errorf("join credential prefix %q overlaps one already registered", c.Prefix))
		default:
			r.joins = append(r.joins, c)
		}
	}
}

func (r *Registry) joinCredentialFor(s string) *JoinCredential {
	for i, c := range r.joins {
		if strings.HasPrefix(s, c.Prefix) || strings.HasPrefix(c.Prefix, s) {
			return &r.joins[i]
		}
	}
	return nil
}

// JoinCredentialFor returns the kind of join credential credential is, by its prefix.
func (r *Registry) JoinCredentialFor(credential string) (JoinCredential, bool) {
	for _, c := range r.joins {
		if strings.HasPrefix(credential, c.Prefix) {
			return c, true
		}
	}
	return JoinCredential{}, false
}

// JoinPrefixes returns the registered credential prefixes.
func (r *Registry) JoinPrefixes() []string {
	out := make([]string, len(r.joins))
	for i, c := range r.joins {
		out[i] = c.Prefix
	}
	return out
}

// ReportKind is a kind of report a node's extension sends up its session (agent/v1 Report): a
// site agent's account of a machine its ramdisk found, a task's progress. The gateway runs
// Handle in a transaction of its own and acknowledges the report once it commits; a report the
// handler refuses with an *api.Error (bad payload) is acknowledged with that error and
// forgotten, any other error leaves it for the node to send again.
type ReportKind struct {
	Name string // e.g. metal.task_progress
	// Roles are the node roles that may send it (api.RoleNode, api.RoleSite); empty is nodes only.
	Roles  []string
	Handle func(ctx context.Context, r *Report) error
}

// Report is one report being handled.
type Report struct {
	Tx      pgx.Tx
	Runtime *Runtime
	// From is the node that sent it, as its session proved.
	NodeID, TenantID, PoolID, Role string
	Payload                        json.RawMessage
}

// ReportKind registers report kinds.
func (r *Registry) ReportKind(ks ...ReportKind) {
	for _, k := range ks {
		switch {
		case !eventTypeRE.MatchString(k.Name):
			r.fail(fmt.Errorf("report kind %q: must be dotted lower-case words (letters and _), e.g. metal.task_progress", k.Name))
		case k.Handle == nil:
			r.fail(fmt.Errorf("report kind %s needs a Handle function", k.Name))
		case r.reports[k.Name] != nil:
			r.fail(fmt.Errorf("report kind %s is registered twice", k.Name))
		default:
			if len(k.Roles) == 0 {
				k.Roles = []string{api.RoleNode}
			}
			r.reports[k.Name] = &k
		}
	}
}

// LookupReportKind returns a registered report kind.
func (r *Registry) LookupReportKind(name string) (ReportKind, bool) {
	k := r.reports[name]
	if k == nil {
		return ReportKind{}, false
	}
	return *k, true
}
