package modules

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// The services below are what a module may use of the core, each as narrow as its callers need.
// compute.New fills them in Runtime; a module never imports the core's packages. Each writes in
// the transaction it is given, so what a module changes commits or rolls back with its call.

// Capacity books and releases capacity. It acts for the call c (its principal, its tenant and
// transaction), under the IAM decision c's own method made: no second decision is asked.
type Capacity interface {
	// Reserve places in as reservations.create would, in c's transaction, on none of the nodes
	// avoid names (by id): nodes that are schedulable but no place for what the module books,
	// as the vps module's VM hosts whose runtime does not answer.
	Reserve(ctx context.Context, c *Call, in api.CreateReservation, avoid ...string) (api.Reservation, error)
	// Release ends an active reservation of c's tenant now, or cancels one not yet started.
	Release(ctx context.Context, c *Call, reservationID string) error
	// Reservations reads reservations, of any tenant, with their allocations: a module reads
	// those it made (in no order; ids that name none are left out).
	Reservations(ctx context.Context, q postgres.Querier, ids []string) ([]api.Reservation, error)
}

// Nodes reaches nodes: commands they carry out once, and the desired state they converge to.
type Nodes interface {
	// Command queues a command for a node of c's tenant, of a registered kind whose Check has
	// accepted its arguments. The node's gateway hears of it when c's transaction commits.
	Command(ctx context.Context, c *Call, in api.CreateCommand) (api.Command, error)
	// BumpDesired moves the desired-state generation of nodes, so that their gateways push the
	// state again (with every registered DesiredKind's part) once tx commits.
	BumpDesired(ctx context.Context, tx pgx.Tx, nodeIDs ...string) error
	// GetCommand reads a command (its state, result and error), of any tenant: a module reads
	// the commands it queued.
	GetCommand(ctx context.Context, q postgres.Querier, id string) (api.Command, error)
}

// Fleet looks up sites, pools and nodes.
type Fleet interface {
	// PoolID returns the id of the pool ref (an id or a name) of tenant, or a not_found error.
	PoolID(ctx context.Context, q postgres.Querier, tenant, ref string) (string, error)
	// NodeID returns the id of the node ref (an id or a name) in pool, not retired, or a
	// not_found error.
	NodeID(ctx context.Context, q postgres.Querier, poolID, ref string) (string, error)
	// TenantNode returns the id of the node ref of tenant (by id, or by name in ref.Pool), or a
	// not_found error, as for a node that does not exist.
	TenantNode(ctx context.Context, q postgres.Querier, tenant string, ref api.NodeRef) (string, error)
	// CAHash is the pin of the machine CA ("sha256:…") that joining machines check.
	CAHash() (string, error)
	// PoolSite returns the id of the site of a pool, "" when it has none.
	PoolSite(ctx context.Context, q postgres.Querier, poolID string) (string, error)
	// SiteAgents returns the ids of the site agents (nodes of role site, not retired) of a site,
	// the online ones first.
	SiteAgents(ctx context.Context, q postgres.Querier, siteID string) ([]string, error)
}

// Access makes tunnel tickets (access.exec, access.console) for a module's own resources: a
// VM's console is a console of the node that runs it. The call's own method made the decision.
type Access interface {
	// ConsoleTicket records a single-use ticket to a console of a node a reservation of c's
	// tenant holds now, and its access.console event.
	ConsoleTicket(ctx context.Context, c *Call, in api.OpenTunnel) (api.TunnelTicket, error)
	// SSHCA returns the public key (authorized_keys form) of the SSH CA of c's tenant, made on
	// its first use: access.sshCertificate signs with it, for a reservation's principal
	// (api.ReservationPrincipal).
	SSHCA(ctx context.Context, c *Call) (string, error)
	// SSHRevoked returns an OpenSSH KRL (what sshd's RevokedKeys reads) of the certificates of
	// reservation that must not log in now: those revoked (access.revoke), and every one once the
	// reservation is no longer active; expired ones are left out. A module whose guests trust the
	// tenant's SSH CA themselves (vps's sandboxes) hands it to them.
	SSHRevoked(ctx context.Context, q postgres.Querier, reservation string) ([]byte, error)
}

// Events writes the event outbox.
type Events interface {
	// Emit writes an event of a registered type in q's transaction.
	Emit(ctx context.Context, q postgres.Querier, e Event) error
}

// Event is one entry of the outbox.
type Event struct {
	Type     string // registered with Registry.EventTypes, e.g. "reservation.created"
	TenantID string
	Subject  string // the id of what it is about
	Data     map[string]any
}

// Jobs enqueues durable jobs (River) of the registered job queues in a transaction: a job
// exists exactly when its transaction commits.
type Jobs interface {
	// InsertTx enqueues one job and returns its River id.
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (int64, error)
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) error
	// CancelTx cancels a job once tx commits: a queued one is never worked, a running one has its
	// context cancelled.
	CancelTx(ctx context.Context, tx pgx.Tx, jobID int64) error
}

// Clock is the database's clock, compute_now(): the real time, or a test's.
type Clock interface {
	Now(ctx context.Context, q postgres.Querier) (time.Time, error)
}

// SecretBox seals what a module keeps secret (a BMC password, a provider's token) with a key
// derived from compute.Options.Secret. The purpose binds a sealed value to what it is for: it
// opens only with the same purpose.
type SecretBox interface {
	Seal(purpose string, plaintext []byte) ([]byte, error)
	Open(purpose string, sealed []byte) ([]byte, error)
}

// Quorum is the destructive-batch gate (docs/fleet.md, "Destructive-batch quorum"): a batch
// method whose batch is over its tenant's quorum policy runs only with an approval of that very
// batch by other principals. Each batch method calls Check once, in its transaction, before it
// changes anything.
type Quorum interface {
	// Check admits batch b of the call c. It returns no error when the batch is within the
	// policy of c's tenant (or its nearest ancestor's), or when b.Approval names an approved,
	// unexpired approval of exactly this batch (same method, targets and params) that c's
	// principal asked for, which it spends in c's transaction and returns. Otherwise it
	// returns an *api.Error: confirmation_required with the approval opened for the batch
	// (details: approvalId, expiresAt), or a refusal of the approval given.
	Check(ctx context.Context, c *Call, b Batch) (approval string, err error)
}

// Batch is a destructive batch as the quorum gate weighs it.
type Batch struct {
	Method string // the batch method's full name, e.g. "nodes.drainMany"
	// Targets are the ids of what the batch acts on, each once (in any order).
	Targets []string
	// Groups are the sets the targets belong to (a pool, a site), for the policy's percent
	// limit: how many members each has in all and how many of them the batch touches.
	Groups []BatchGroup
	// Params is the rest of what the batch does (drain's end, a deploy's image), without the
	// targets and the approval; it is bound into the approval with them.
	Params map[string]any
	// Approval is the approval the call carries, "" for none.
	Approval string
}

// BatchGroup is a set some of a batch's targets belong to.
type BatchGroup struct {
	Kind  string // "pool", "site"
	ID    string
	Size  int // its members in all
	Count int // the members the batch touches
}
