package api

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// IAM resource types of the destructive-batch quorum (docs/fleet.md, "Destructive-batch quorum").
const (
	ResourceApproval = "compute-approval" // an approval of one destructive batch
	ResourceQuorum   = "compute-quorum"   // a tenant's quorum policy
)

// The quorum groups: a tenant's policy, and the approvals a batch over its threshold waits for.
var (
	QuorumGet = NewMethod[GetQuorum, QuorumPolicy]("quorum", "get", false, ResourceQuorum, "v1.0",
		"The destructive-batch quorum policy that applies to a tenant: its own, or the nearest ancestor's.")
	QuorumSet = NewMethod[SetQuorum, QuorumPolicy]("quorum", "set", true, ResourceQuorum, "v1.0",
		"Set a tenant's destructive-batch quorum policy: how large a batch may be before other people must approve it, and how many.")

	ApprovalsList = NewMethod[ListApprovals, Page[Approval]]("approvals", "list", false, ResourceApproval, "v1.0",
		"List the approvals destructive batches asked for, newest first, by state.")
	ApprovalsGet = NewMethod[ApprovalRef, Approval]("approvals", "get", false, ResourceApproval, "v1.0",
		"Get an approval: the batch it is of, its state and its votes.")
	ApprovalsApprove = NewMethod[DecideApproval, Approval]("approvals", "approve", true, ResourceApproval, "v1.0",
		"Approve a destructive batch another principal asked for; once enough have, its caller may run it, once.")
	ApprovalsDeny = NewMethod[DecideApproval, Approval]("approvals", "deny", true, ResourceApproval, "v1.0",
		"Deny a destructive batch: it may not run with this approval.")
)

// QuorumMethods returns the quorum and approvals groups.
func QuorumMethods() []MethodInfo { return infos(quorumTable()) }

func quorumTable() []Describer {
	return []Describer{QuorumGet, QuorumSet, ApprovalsList, ApprovalsGet, ApprovalsApprove, ApprovalsDeny}
}

// Defaults and limits of a quorum policy.
const (
	DefaultApprovers   = 1
	MaxApprovers       = 10
	DefaultApprovalTTL = time.Hour
	MaxApprovalTTL     = 7 * 24 * time.Hour
	// MaxBatch bounds the targets of one batch method.
	MaxBatch = 1000
)

// QuorumPolicy is a tenant's destructive-batch quorum: a batch method (nodes.drainMany,
// nodes.retireMany, a module's) whose batch touches more than MaxNodes targets, or more than
// MaxPercent of a pool (a site, for machines), runs only with an approval of that very batch by
// Approvers principals other than its caller. A zero MaxNodes or MaxPercent sets no limit of
// its kind; with both zero the policy is off.
type QuorumPolicy struct {
	TenantID string `json:"tenantId"`
	// From is the tenant whose policy this is: TenantID's own, or its nearest ancestor's. Empty
	// when no tenant on the path has one (the policy is then off).
	From       string     `json:"from,omitempty"`
	MaxNodes   int        `json:"maxNodes"`
	MaxPercent int        `json:"maxPercent"`
	Approvers  int        `json:"approvers"`
	TTL        string     `json:"ttl"` // how long an approval may be approved and then spent, e.g. "1h"
	UpdatedBy  string     `json:"updatedBy,omitempty"`
	UpdatedAt  *time.Time `json:"updatedAt,omitempty"`
}

// Off reports whether the policy gates nothing.
func (p QuorumPolicy) Off() bool { return p.MaxNodes == 0 && p.MaxPercent == 0 }

// GetQuorum is the input of quorum.get.
type GetQuorum struct {
	TenantID string `json:"tenantId,omitempty"`
}

// SetQuorum is the input of quorum.set: a tenant's own policy, replacing the one it had.
type SetQuorum struct {
	TenantID   string `json:"tenantId,omitempty"`
	MaxNodes   int    `json:"maxNodes,omitempty"`
	MaxPercent int    `json:"maxPercent,omitempty"`
	Approvers  int    `json:"approvers,omitempty"` // 0 means DefaultApprovers
	TTL        string `json:"ttl,omitempty"`       // "" means DefaultApprovalTTL
}

// Validate implements the input check.
func (in SetQuorum) Validate() error {
	switch {
	case in.MaxNodes < 0 || in.MaxNodes > 1_000_000:
		return InvalidField("maxNodes", "must be between 1 and 1000000, or 0 for no count limit; got %d", in.MaxNodes)
	case in.MaxPercent < 0 || in.MaxPercent > 100:
		return InvalidField("maxPercent", "must be a percent between 1 and 100, or 0 for no percent limit; got %d", in.MaxPercent)
	case in.Approvers < 0 || in.Approvers > MaxApprovers:
		return InvalidField("approvers", "must be between 1 and %d (0 means %d); got %d", MaxApprovers, DefaultApprovers, in.Approvers)
	}
	_, err := in.ApprovalTTL()
	return err
}

// ApprovalTTL is TTL with its default.
func (in SetQuorum) ApprovalTTL() (time.Duration, error) {
	if in.TTL == "" {
		return DefaultApprovalTTL, nil
	}
	d, err := ParseDuration("ttl", in.TTL)
	if err == nil && (d < time.Minute || d > MaxApprovalTTL) {
		return 0, InvalidField("ttl", "must be between 1m and %s; got %s", MaxApprovalTTL, in.TTL)
	}
	return d, err
}

// The states of an approval. A pending or approved approval past its expiry reads as expired.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalConsumed = "consumed" // the batch ran with it
	ApprovalExpired  = "expired"
)

// Approval is the approval one destructive batch asked for: the call (Method, Targets, Params)
// it is bound to by Digest, who asked, and the votes of the others.
type Approval struct {
	ID       string `json:"id"`
	TenantID string `json:"tenantId"`
	Method   string `json:"method"`
	// Targets are the ids the batch acts on, sorted; Params the rest of what it does.
	Targets []string       `json:"targets"`
	Params  map[string]any `json:"params"`
	// Digest is the SHA-256 (hex) of the method, the sorted targets and the canonical params:
	// the approval spends only on a call with the same three.
	Digest      string         `json:"digest"`
	Reason      string         `json:"reason"` // why it needs approval, e.g. "12 nodes (more than 10)"
	RequestedBy string         `json:"requestedBy"`
	State       string         `json:"state"`
	Approvers   int            `json:"approvers"` // the approve votes it needs
	Votes       []ApprovalVote `json:"votes"`
	CreatedAt   time.Time      `json:"createdAt"`
	ExpiresAt   time.Time      `json:"expiresAt"`
	ConsumedAt  *time.Time     `json:"consumedAt,omitempty"`
}

// ApprovalVote is one principal's answer to an approval.
type ApprovalVote struct {
	Principal string    `json:"principal"`
	Approve   bool      `json:"approve"`
	Comment   string    `json:"comment,omitempty"`
	At        time.Time `json:"at"`
}

// ListApprovals is the input of approvals.list.
type ListApprovals struct {
	PageRequest
	TenantID string `json:"tenantId,omitempty"`
	State    string `json:"state,omitempty"`
}

// Validate implements the input check.
func (in ListApprovals) Validate() error {
	if err := ValidateEnum("state", in.State, ApprovalPending, ApprovalApproved, ApprovalDenied, ApprovalConsumed, ApprovalExpired); err != nil {
		return err
	}
	return in.PageRequest.Validate()
}

// ApprovalRef names an approval.
type ApprovalRef struct {
	Approval string `json:"approval"`
}

// Validate implements the input check.
func (in ApprovalRef) Validate() error { return validateApprovalID("approval", in.Approval) }

func validateApprovalID(field, id string) error {
	if uuid.Validate(id) != nil {
		return InvalidField(field, "%q is not an approval's id (the approvalId of a confirmation_required answer, or approvals.list)", id)
	}
	return nil
}

// DecideApproval is the input of approvals.approve and approvals.deny.
type DecideApproval struct {
	Approval string `json:"approval"`
	Comment  string `json:"comment,omitempty"`
}

// Validate implements the input check.
func (in DecideApproval) Validate() error {
	if err := validateApprovalID("approval", in.Approval); err != nil {
		return err
	}
	return ValidateText("comment", in.Comment, 500)
}

// ValidateApproval checks the approval a batch method's input carries: empty, or an approval's id.
func ValidateApproval(id string) error {
	if id == "" {
		return nil
	}
	return validateApprovalID("approval", id)
}

// ValidateBatch checks the targets of a batch method: 1 to MaxBatch references, each once.
func ValidateBatch(field string, refs []string) error {
	if len(refs) == 0 || len(refs) > MaxBatch {
		return InvalidField(field, "must name between 1 and %d, got %d", MaxBatch, len(refs))
	}
	seen := make(map[string]bool, len(refs))
	for i, r := range refs {
		if err := ValidateRef(fmt.Sprintf("%s[%d]", field, i), r); err != nil {
			return err
		}
		if seen[r] {
			return InvalidField(field, "names %q twice", r)
		}
		seen[r] = true
	}
	return nil
}
