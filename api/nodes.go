package api

import (
	"encoding/json"
	"regexp"
	"time"
)

// IAM resource types of the node groups.
const (
	ResourceJoinToken = "compute-join-token"
	ResourceCommand   = "compute-command"
)

// JoinToken admits machines into a pool. Token is set only in the answer of joinTokens.create:
// it is shown once and stored hashed.
type JoinToken struct {
	ID          string     `json:"id"`
	TenantID    string     `json:"tenantId"`
	PoolID      string     `json:"poolId"`
	Description string     `json:"description,omitempty"`
	Hint        string     `json:"hint"` // the token's last characters
	MaxUses     int        `json:"maxUses"`
	UsesLeft    int        `json:"usesLeft"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	RevokedAt   *time.Time `json:"revokedAt,omitempty"`
	CreatedBy   string     `json:"createdBy"`
	CreatedAt   time.Time  `json:"createdAt"`
	// NodeID is set on a takeover token: it admits only a machine taking over that node.
	NodeID string `json:"nodeId,omitempty"`
	Role   string `json:"role"` // what it admits machines as: node, or site (a site agent)
	// CAHash pins the machine CA (sha256:… of its public key, kubeadm's form): bcd join --ca-hash.
	CAHash string `json:"caHash,omitempty"`
	Token  string `json:"token,omitempty"`
}

// ForReplay is what an idempotent replay of joinTokens.create answers, and so all the
// idempotency record may keep: the token without its secret, which is shown once.
func (t JoinToken) ForReplay() any {
	t.Token = ""
	return t
}

// Limits of join tokens.
const (
	DefaultJoinTokenTTL = 24 * time.Hour
	MaxJoinTokenTTL     = 30 * 24 * time.Hour
	MaxJoinTokenUses    = 100_000
)

// CreateJoinToken is the input of joinTokens.create.
type CreateJoinToken struct {
	TenantID    string `json:"tenantId,omitempty"`
	Pool        string `json:"pool"`
	MaxUses     int    `json:"maxUses,omitempty"` // default 1: single use
	TTL         string `json:"ttl,omitempty"`     // default 24h, at most 720h
	Description string `json:"description,omitempty"`
	// Node makes a takeover token: it admits only a machine that takes over this node of the
	// pool (its id or name), e.g. one reinstalled and without its old journal.
	Node string `json:"node,omitempty"`
	// Role is what the token admits machines as: node (the default) or site, a site token:
	// bcd site joins with it as the site agent of the pool's site (the pool must have a site).
	Role string `json:"role,omitempty"`
}

// Validate implements the input check.
func (in CreateJoinToken) Validate() error {
	if err := ValidateRef("pool", in.Pool); err != nil {
		return err
	}
	if in.Node != "" {
		if err := ValidateRef("node", in.Node); err != nil {
			return err
		}
	}
	if err := ValidateEnum("role", in.Role, RoleNode, RoleSite); err != nil {
		return err
	}
	if in.Role == RoleSite && in.Node != "" {
		return InvalidField("node", "a site token admits site agents; it cannot take over a node")
	}
	if in.MaxUses < 0 || in.MaxUses > MaxJoinTokenUses {
		return InvalidField("maxUses", "must be between 1 and %d, got %d", MaxJoinTokenUses, in.MaxUses)
	}
	if in.TTL != "" {
		d, err := ParseDuration("ttl", in.TTL)
		if err != nil {
			return err
		}
		if d > MaxJoinTokenTTL {
			return InvalidField("ttl", "must be at most %s, got %s", MaxJoinTokenTTL, in.TTL)
		}
	}
	return ValidateText("description", in.Description, MaxDescription)
}

// ListJoinTokens is the input of joinTokens.list.
type ListJoinTokens struct {
	TenantID string `json:"tenantId,omitempty"`
	Pool     string `json:"pool,omitempty"`
	PageRequest
}

// RevokeJoinToken is the input of joinTokens.revoke.
type RevokeJoinToken struct {
	TenantID string `json:"tenantId,omitempty"`
	Token    string `json:"token"` // the token's id
}

// Validate implements the input check.
func (in RevokeJoinToken) Validate() error { return ValidateRef("token", in.Token) }

// NodeRef names a node: by id, or by name within a pool.
type NodeRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Node     string `json:"node"`
	Pool     string `json:"pool,omitempty"`
}

// Validate implements the input check.
func (in NodeRef) Validate() error { return ValidateRef("node", in.Node) }

// CordonNode is the input of nodes.cordon: no new bookings.
type CordonNode struct{ NodeRef }

// UncordonNode is the input of nodes.uncordon: bookable again.
type UncordonNode struct{ NodeRef }

// DrainNode is the input of nodes.drain: no new bookings, and the existing ones are ended at
// once (End) or left to run out.
type DrainNode struct {
	NodeRef
	End bool `json:"end,omitempty"`
}

// RetireNode is the input of nodes.retire: the node leaves for good. It must hold nothing; its
// certificates are revoked.
type RetireNode struct{ NodeRef }

// DrainNodes is the input of nodes.drainMany: drain several nodes of one pool in one
// transaction, all or none. A batch over the tenant's quorum policy needs an approval of it
// (docs/fleet.md, "Destructive-batch quorum").
type DrainNodes struct {
	TenantID string   `json:"tenantId,omitempty"`
	Pool     string   `json:"pool"`
	Nodes    []string `json:"nodes"` // ids or names in the pool
	End      bool     `json:"end,omitempty"`
	// Approval is the id of an approved approval of this very batch, once a first call has
	// answered confirmation_required with it and others have approved it.
	Approval string `json:"approval,omitempty"`
}

// Validate implements the input check.
func (in DrainNodes) Validate() error {
	return first(ValidateRef("pool", in.Pool), ValidateBatch("nodes", in.Nodes), ValidateApproval(in.Approval))
}

// RetireNodes is the input of nodes.retireMany: retire several nodes of one pool, all or none;
// none may hold a booking. Approval is as for DrainNodes.
type RetireNodes struct {
	TenantID string   `json:"tenantId,omitempty"`
	Pool     string   `json:"pool"`
	Nodes    []string `json:"nodes"`
	Approval string   `json:"approval,omitempty"`
}

// Validate implements the input check.
func (in RetireNodes) Validate() error {
	return first(ValidateRef("pool", in.Pool), ValidateBatch("nodes", in.Nodes), ValidateApproval(in.Approval))
}

// NodeBatch answers a batch of nodes: each node as the batch left it, in the order named.
type NodeBatch struct {
	Nodes []Node `json:"nodes"`
	// Approval is the approval the batch spent, if it needed one.
	Approval string `json:"approval,omitempty"`
}

// SetNodeLabels is the input of nodes.setLabels: the labels are replaced.
type SetNodeLabels struct {
	NodeRef
	Labels map[string]string `json:"labels"`
}

// Validate implements the input check.
func (in SetNodeLabels) Validate() error {
	if err := in.NodeRef.Validate(); err != nil {
		return err
	}
	return ValidateLabels("labels", in.Labels)
}

// Command kinds a node carries out.
const (
	CommandInventoryRefresh = "inventory.refresh"
	CommandGPUReset         = "gpu.reset"
	CommandHealthCheck      = "health.check"
	CommandDiagRun          = "diag.run"
)

// Command states. A command past its deadline is failed, not lost.
const (
	CommandPending    = "pending"
	CommandDispatched = "dispatched"
	CommandSucceeded  = "succeeded"
	CommandFailed     = "failed"
	CommandCancelled  = "cancelled"
)

// Limits of commands.
const (
	DefaultCommandDeadline = 5 * time.Minute
	MaxCommandDeadline     = 24 * time.Hour
)

// Command is one-shot work for a node.
type Command struct {
	ID           string          `json:"id"`
	TenantID     string          `json:"tenantId"`
	NodeID       string          `json:"nodeId"`
	Kind         string          `json:"kind"`
	Args         json.RawMessage `json:"args"`
	State        string          `json:"state"`
	Deadline     time.Time       `json:"deadline"`
	Result       json.RawMessage `json:"result,omitempty"`
	Error        string          `json:"error,omitempty"`
	Attempts     int             `json:"attempts"`
	CreatedBy    string          `json:"createdBy"`
	CreatedAt    time.Time       `json:"createdAt"`
	DispatchedAt *time.Time      `json:"dispatchedAt,omitempty"`
	FinishedAt   *time.Time      `json:"finishedAt,omitempty"`
	// SecretSet says the command carries a secret, which no answer shows; it is forgotten
	// once the command finishes.
	SecretSet bool `json:"secretSet,omitempty"`
}

// CreateCommand is the input of commands.create. Args by kind: gpu.reset {"gpu": index, "force":
// bool}; diag.run {"test": name, "seconds": n}; the others take none.
type CreateCommand struct {
	NodeRef
	Kind     string          `json:"kind"`
	Args     json.RawMessage `json:"args,omitempty"`
	Deadline string          `json:"deadline,omitempty"` // from now; default 5m, at most 24h
	// Secret is what the command needs that nobody may read back (a BMC password): a JSON
	// object stored sealed, opened only to be sent to the node over its session, never shown by
	// an answer, and erased when the command finishes. Write-only.
	Secret json.RawMessage `json:"secret,omitempty"`
}

// Validate implements the input check.
func (in CreateCommand) Validate() error {
	if err := in.NodeRef.Validate(); err != nil {
		return err
	}
	// Which kinds exist is the server's registry's to say (modules add kinds); here only the form.
	if !ValidKind(in.Kind) {
		return InvalidField("kind", "%q is not a command kind: they are dotted lower-case words, e.g. gpu.reset", in.Kind)
	}
	if len(in.Args) > 0 {
		var obj map[string]any
		if err := json.Unmarshal(in.Args, &obj); err != nil || obj == nil {
			return InvalidField("args", "must be a JSON object")
		}
		if len(in.Args) > 16<<10 {
			return InvalidField("args", "is larger than 16 KiB")
		}
	}
	if len(in.Secret) > 0 {
		var obj map[string]any
		if err := json.Unmarshal(in.Secret, &obj); err != nil || obj == nil {
			return InvalidField("secret", "must be a JSON object")
		}
		if len(in.Secret) > 8<<10 {
			return InvalidField("secret", "is larger than 8 KiB")
		}
	}
	if in.Deadline != "" {
		d, err := ParseDuration("deadline", in.Deadline)
		if err != nil {
			return err
		}
		if d > MaxCommandDeadline {
			return InvalidField("deadline", "must be at most %s", MaxCommandDeadline)
		}
	}
	return nil
}

var kindRE = regexp.MustCompile(`^[a-z][a-z0-9]*(\.[a-z][a-z0-9]*)+$`)

// ValidKind reports whether s has the form of a command or desired-state kind: dotted lower-case
// words, e.g. gpu.reset or vps.instances. (agent/ext, which imports nothing of the control plane,
// keeps its own copy of the rule.)
func ValidKind(s string) bool { return kindRE.MatchString(s) }

// GPUResetArgs are the arguments of gpu.reset.
type GPUResetArgs struct {
	GPU   *int `json:"gpu"`
	Force bool `json:"force,omitempty"` // reset even while the GPU is held
}

// GetCommand is the input of commands.get.
type GetCommand struct {
	Command string `json:"command"`
}

// Validate implements the input check.
func (in GetCommand) Validate() error { return ValidateRef("command", in.Command) }

// ListCommands is the input of commands.list.
type ListCommands struct {
	TenantID string `json:"tenantId,omitempty"`
	Node     string `json:"node,omitempty"` // id
	State    string `json:"state,omitempty"`
	PageRequest
}

// CommandStates lists the states of a command.
var CommandStates = []string{CommandPending, CommandDispatched, CommandSucceeded, CommandFailed, CommandCancelled}

// Validate implements the input check.
func (in ListCommands) Validate() error {
	return first(ValidateEnum("state", in.State, CommandStates...), in.PageRequest.Validate())
}

// CancelCommand is the input of commands.cancel.
type CancelCommand struct {
	Command string `json:"command"`
}

// Validate implements the input check.
func (in CancelCommand) Validate() error { return ValidateRef("command", in.Command) }
