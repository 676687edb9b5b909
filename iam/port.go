// Package iam is Better Compute's only view of identity and policy: the Port interface, the
// in-process implementation (Local, made by Embedded) and the types they exchange. Better Compute
// has no users, roles or keys of its own; it only asks.
package iam

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"
)

// Port is how Better Compute learns who is calling and whether they may. Fleet paths (heartbeats,
// inventory, commands, reconcilers) never call it.
type Port interface {
	// Authenticate turns a credential (a bearer token) into the principal it belongs to. A
	// missing, malformed, unknown, expired or revoked credential is an error wrapping
	// ErrUnauthenticated.
	Authenticate(ctx context.Context, credential string) (Principal, error)
	// Authorize decides one action on one resource in one tenant.
	Authorize(ctx context.Context, p Principal, r Request) (Decision, error)
	// AuthorizeMany decides several requests at once (to filter lists); answers are in order.
	AuthorizeMany(ctx context.Context, p Principal, rs []Request) ([]Decision, error)
	// RegisterCatalog contributes Better Compute's resource types and actions to the catalog.
	RegisterCatalog(ctx context.Context, c Catalog) error
	// TenantPath returns tenant and its ancestors, nearest first, ending at the root. A tenant
	// that does not exist has an empty path.
	TenantPath(ctx context.Context, tenant string) ([]string, error)

	Biller
	Confirmer
	// Flag evaluates a boolean feature flag for a tenant.
	Flag(ctx context.Context, tenantID, key string) (bool, error)
	// Events returns IAM's events after a cursor (negative: start at the end) and the next cursor.
	Events(ctx context.Context, after int64, limit int) ([]Event, int64, error)
}

// Confirmer is the delegated-confirmation half of a port. A decision that an agent's delegation
// reserves for its person comes back with ConfirmationRequired; the caller asks for a
// confirmation, the person decides it, and the next decision of the same request consumes it.
type Confirmer interface {
	// RequestConfirmation opens a confirmation of r for the agent p (or returns the one open).
	RequestConfirmation(ctx context.Context, p Principal, r Request) (Confirmation, error)
	// Confirmation reads one.
	Confirmation(ctx context.Context, id string) (Confirmation, error)
}

// Confirmation is a person's answer to what an agent asked for: one call (Request.Method and
// Request.Input, shown to the person), until ExpiresAt, spent by one decision.
type Confirmation struct {
	ID        string     `json:"id"`
	AgentID   string     `json:"agentId"`
	Request   Request    `json:"request"`
	InputHash string     `json:"inputHash"`
	State     string     `json:"state"` // pending, approved, denied, consumed, expired
	ExpiresAt time.Time  `json:"expiresAt"`
	DecidedBy string     `json:"decidedBy,omitempty"`
	DecidedAt *time.Time `json:"decidedAt,omitempty"`
}

// Initializer is implemented by ports that own state to prepare before first use (the embedded
// port's tables and root tenant). compute.Initialize calls it before RegisterCatalog.
type Initializer interface {
	Initialize(ctx context.Context) error
}

// ErrUnauthenticated is wrapped by every authentication failure.
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrNotFound is wrapped by admin calls about a tenant, identity, key or role that does not exist.
var ErrNotFound = errors.New("not found")

// IdentityKind is the kind of an identity.
type IdentityKind string

// The identity kinds. API keys go to services and agents only.
const (
	KindUser    IdentityKind = "user"
	KindService IdentityKind = "service"
	KindAgent   IdentityKind = "agent"
)

// Principal is an authenticated caller.
type Principal struct {
	ID       string       `json:"id"` // the identity id
	Kind     IdentityKind `json:"kind"`
	TenantID string       `json:"tenantId"`
	Name     string       `json:"name"`
	KeyID    string       `json:"keyId,omitempty"` // the API key or token it authenticated with
	// TokenKind is the kind of credential: key, ses, rol, sts or dlg.
	TokenKind TokenKind `json:"tokenKind,omitempty"`
	// RoleID restricts decisions to one role (a biam_rol_ token).
	RoleID string `json:"roleId,omitempty"`
	// DelegationID is the delegation an agent acts under (a biam_dlg_ token).
	DelegationID string `json:"delegationId,omitempty"`

	// Credential is the token it authenticated with, kept so a remote port can decide on the
	// caller's behalf. Never serialised.
	Credential string `json:"-"`
}

// Resource names what an action is on: a type from the catalog and an id ("*" for a collection).
type Resource struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// String is the resource as policies write it: type/id.
func (r Resource) String() string { return r.Type + "/" + r.ID }

// Request is one question to decide.
type Request struct {
	TenantID string   `json:"tenantId"`
	Action   string   `json:"action"`
	Resource Resource `json:"resource"`
	// Context carries what else conditions may test, e.g. "request.ip".
	Context map[string]any `json:"context,omitempty"`
	// Method and Input are the call being decided (e.g. reservations.create and its JSON input),
	// set for an agent's calls: a confirmation is of one call, bound to the hash of both, and
	// spends only on a call with the same method and the same canonical input.
	Method string          `json:"method,omitempty"`
	Input  json.RawMessage `json:"input,omitempty"`
}

// Decision is the answer to a Request.
type Decision struct {
	Allowed bool `json:"allowed"`
	// ConfirmationRequired: the policies allow it, but the agent's delegation reserves the
	// action for its person's confirmation, and there is none to consume.
	ConfirmationRequired bool   `json:"confirmationRequired,omitempty"`
	Reason               string `json:"reason,omitempty"`  // why, in words
	Matched              string `json:"matched,omitempty"` // the statement that decided, as role/sid
	// Confirmed is the confirmation an allowed decision consumed: the action was reserved for a
	// person, who approved this very call.
	Confirmed string `json:"confirmed,omitempty"`
}

// ResourceType is an entry of the catalog, e.g. compute-pool.
type ResourceType struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Action is an entry of the catalog, e.g. compute:pools:create on compute-pool.
type Action struct {
	Name         string `json:"name"`
	ResourceType string `json:"resourceType"`
	Description  string `json:"description,omitempty"`
}

// Catalog is what Better Compute contributes to IAM at Initialize.
type Catalog struct {
	ResourceTypes []ResourceType `json:"resourceTypes"`
	Actions       []Action       `json:"actions"`
}

// Biller is the billing half of a port: meters and an idempotent usage ledger.
type Biller interface {
	// EnsureMeters creates the meters that are missing; existing ones are left as they are.
	EnsureMeters(ctx context.Context, meters []Meter) error
	// RecordUsage records usage once per IdempotencyKey: a repeat returns the first receipt.
	RecordUsage(ctx context.Context, u Usage) (Receipt, error)
}

// Meter is something usage is counted in, e.g. gpu.h100.hours.
type Meter struct {
	Key         string `json:"key"` // lowercase, dot-separated
	Unit        string `json:"unit"`
	Description string `json:"description,omitempty"`
}

// Usage is one entry of the billing ledger.
type Usage struct {
	TenantID       string            `json:"tenantId"`
	Meter          string            `json:"meter"`
	Quantity       float64           `json:"quantity"`
	IdentityID     string            `json:"identityId,omitempty"`
	Tags           map[string]string `json:"tags,omitempty"`
	OccurredAt     time.Time         `json:"occurredAt"`
	IdempotencyKey string            `json:"idempotencyKey"`
}

// Receipt acknowledges recorded usage. Duplicate is true when the key had been recorded before:
// the receipt is then the first one.
type Receipt struct {
	ID         string    `json:"id"`
	RecordedAt time.Time `json:"recordedAt"`
	Duplicate  bool      `json:"duplicate"`
}

// TenantWithin reports whether tenant is ancestor or one of its descendants, from the port's
// tenant path (which the embedded port caches). A tenant that does not exist is within nothing.
func TenantWithin(ctx context.Context, p Port, tenant, ancestor string) (bool, error) {
	path, err := p.TenantPath(ctx, tenant)
	return slices.Contains(path, ancestor), err
}
