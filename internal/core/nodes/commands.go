package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// CommandsChannel is the LISTEN/NOTIFY channel a new command is announced on, with its node's id.
const CommandsChannel = "compute_commands"

// DesiredChannel announces, with a node's id, that its desired state moved (the triggers of the
// migration send it).
const DesiredChannel = "compute_desired"

const commandColumns = `id::text, tenant_id, node_id::text, kind, args, state, deadline, result, error, attempts, created_by, created_at, dispatched_at, finished_at, secret IS NOT NULL`

func scanCommand(row pgx.Row) (api.Command, error) {
	var c api.Command
	var args, result []byte
	err := row.Scan(&c.ID, &c.TenantID, &c.NodeID, &c.Kind, &args, &c.State, &c.Deadline, &result, &c.Error, &c.Attempts, &c.CreatedBy, &c.CreatedAt, &c.DispatchedAt, &c.FinishedAt, &c.SecretSet)
	c.Args, c.Result = args, result
	return c, err
}

// GetCommand reads a command by id.
func GetCommand(ctx context.Context, q postgres.Querier, id string) (api.Command, error) {
	c, err := scanCommand(q.QueryRow(ctx, `SELECT `+commandColumns+` FROM compute.commands WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return c, api.NotFound("command", id)
	}
	return c, err
}

// SecretPurpose binds a command's sealed secret to the command.
func SecretPurpose(commandID string) string { return "command-secret:" + commandID }

// coreCommandKinds are the kinds every node carries out; modules register theirs the same way.
func coreCommandKinds() []modules.CommandKind {
	return []modules.CommandKind{
		{Name: api.CommandInventoryRefresh, Summary: "Read the node's hardware again and report it."},
		{Name: api.CommandGPUReset, Summary: "Reset one GPU (args: gpu, force).", Check: checkReset},
		{Name: api.CommandHealthCheck, Summary: "Check the GPUs' health now."},
		{Name: api.CommandDiagRun, Summary: "Run a GPU diagnostic (args: test quick|medium|long, seconds)."},
	}
}

// QueueCommand queues a command of a registered kind for a node of c's tenant, in c's
// transaction: the commands.create method, and modules.Nodes.Command for modules.
func QueueCommand(ctx context.Context, c *modules.Call, reg *modules.Registry, in api.CreateCommand) (api.Command, error) {
	kind, ok := reg.LookupCommandKind(in.Kind)
	if !ok {
		return api.Command{}, api.InvalidField("kind", "%q is not a command kind of this control plane: it has %s", in.Kind, strings.Join(reg.CommandKinds(), ", "))
	}
	node, err := fleet.NodeTarget(ctx, modules.Lookup{Q: c.Tx, Principal: c.Principal}, in.NodeRef)
	if err != nil {
		return api.Command{}, err
	}
	if node.TenantID != c.Target.TenantID {
		return api.Command{}, api.NotFound("node", in.Node)
	}
	args := in.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if kind.Check != nil {
		if err := kind.Check(ctx, c.Tx, node.ResourceID, args); err != nil {
			return api.Command{}, err
		}
	}
	deadline := api.DefaultCommandDeadline
	if in.Deadline != "" {
		deadline, _ = api.ParseDuration("deadline", in.Deadline)
	}
	id := fleet.NewID()
	var secret []byte
	if len(in.Secret) > 0 {
		if secret, err = c.Runtime.Secrets.Seal(SecretPurpose(id), in.Secret); err != nil {
			return api.Command{}, err
		}
	}
	cmd, err := scanCommand(c.Tx.QueryRow(ctx, `INSERT INTO compute.commands (id, tenant_id, node_id, kind, args, deadline, created_by, secret)
		VALUES ($1, $2, $3, $4, $5, compute.compute_now() + make_interval(secs => $6), $7, $8) RETURNING `+commandColumns,
		id, c.Target.TenantID, node.ResourceID, in.Kind, []byte(args), deadline.Seconds(), c.Principal.ID, secret))
	if err != nil {
		return cmd, err
	}
	// The gateway holding the node's session hears of it as the transaction commits.
	if _, err := c.Tx.Exec(ctx, `SELECT pg_catalog.pg_notify($1, $2)`, CommandsChannel, node.ResourceID); err != nil {
		return cmd, err
	}
	return cmd, events.Emit(ctx, c.Tx, "command.created", c.Target.TenantID, cmd.ID, map[string]any{"node": node.ResourceID, "kind": in.Kind})
}

func registerCommands(r *modules.Registry) {
	r.CommandKind(coreCommandKinds()...)
	modules.Handle(r, api.CommandsCreate,
		func(ctx context.Context, l modules.Lookup, in api.CreateCommand) (modules.Target, error) {
			t, err := fleet.NodeTarget(ctx, l, in.NodeRef)
			t.ResourceID = "*"
			return t, err
		},
		func(ctx context.Context, c *modules.Call, in api.CreateCommand) (api.Command, error) {
			return QueueCommand(ctx, c, r, in)
		})

	commandTarget := func(ctx context.Context, l modules.Lookup, id string) (modules.Target, error) {
		t := modules.Target{Existing: true, Kind: "command", Ref: id, ResourceID: id}
		if !fleet.IsID(id) {
			return t, api.NotFound("command", id)
		}
		err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.commands WHERE id = $1`, id).Scan(&t.TenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return t, api.NotFound("command", id)
		}
		return t, err
	}
	modules.Handle(r, api.CommandsGet,
		func(ctx context.Context, l modules.Lookup, in api.GetCommand) (modules.Target, error) {
			return commandTarget(ctx, l, in.Command)
		},
		func(ctx context.Context, c *modules.Call, in api.GetCommand) (api.Command, error) {
			return scanCommand(c.Tx.QueryRow(ctx, `SELECT `+commandColumns+` FROM compute.commands WHERE id = $1 AND tenant_id = $2`, in.Command, c.Target.TenantID))
		})
	modules.Handle(r, api.CommandsList, nil, func(ctx context.Context, c *modules.Call, in api.ListCommands) (api.Page[api.Command], error) {
		var node, state *string
		if in.Node != "" {
			if !fleet.IsID(in.Node) {
				return api.Page[api.Command]{}, api.InvalidField("node", "must be a node id")
			}
			node = &in.Node
		}
		if in.State != "" {
			state = &in.State
		}
		return fleet.Paginate(ctx, c.Tx, in.PageRequest, scanCommand, func(c api.Command) string { return c.ID },
			`SELECT `+commandColumns+` FROM compute.commands WHERE tenant_id = $3 AND ($4::uuid IS NULL OR node_id = $4)
			 AND ($5::text IS NULL OR state = $5) AND ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2`, c.Target.TenantID, node, state)
	})
	modules.Handle(r, api.CommandsCancel,
		func(ctx context.Context, l modules.Lookup, in api.CancelCommand) (modules.Target, error) {
			return commandTarget(ctx, l, in.Command)
		},
		func(ctx context.Context, c *modules.Call, in api.CancelCommand) (api.Command, error) {
			cmd, err := scanCommand(c.Tx.QueryRow(ctx, `UPDATE compute.commands SET state = 'cancelled', finished_at = compute.compute_now(), secret = NULL
				WHERE id = $1 AND tenant_id = $2 AND state IN ('pending', 'dispatched') RETURNING `+commandColumns, in.Command, c.Target.TenantID))
			if err == nil {
				err = events.Emit(ctx, c.Tx, "command.finished", cmd.TenantID, cmd.ID, map[string]any{
					"node": cmd.NodeID, "kind": cmd.Kind, "state": cmd.State, "error": ""})
			}
			if errors.Is(err, pgx.ErrNoRows) {
				cur, err := scanCommand(c.Tx.QueryRow(ctx, `SELECT `+commandColumns+` FROM compute.commands WHERE id = $1`, in.Command))
				if err != nil {
					return cur, err
				}
				return cur, &api.Error{Code: api.CodeFailedPrecondition, Message: fmt.Sprintf("command %s has already %s", cur.ID, cur.State),
					Details: map[string]any{"reason": "state", "state": cur.State}}
			}
			return cmd, err
		})
}

// checkReset refuses a reset of a GPU that is held, unless forced: a holder's job would die.
func checkReset(ctx context.Context, q postgres.Querier, node string, raw json.RawMessage) error {
	var a api.GPUResetArgs
	if err := json.Unmarshal(raw, &a); err != nil || a.GPU == nil {
		return api.InvalidField("args", "gpu.reset needs {\"gpu\": <index>}")
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.devices WHERE node_id = $1 AND index = $2)`, node, *a.GPU).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return api.InvalidField("args.gpu", "node has no GPU %d", *a.GPU)
	}
	if a.Force {
		return nil
	}
	var holder string
	span := capacity.GPUSpan(*a.GPU)
	err := q.QueryRow(ctx, `SELECT reservation_id::text FROM compute.bookings WHERE node_id = $1 AND resource = 'gpu'
		AND atoms && int4range($2, $3) AND during @> compute.compute_now() LIMIT 1`, node, span.Lo, span.Hi).Scan(&holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return &api.Error{Code: api.CodeFailedPrecondition,
		Message: fmt.Sprintf("GPU %d is held by reservation %s; a reset would kill its work. Pass \"force\": true to reset it anyway", *a.GPU, holder),
		Details: map[string]any{"reason": "gpu_held", "reservation": holder}}
}

// Dispatched is a command on its way to its node, with its secret still sealed
// (SecretPurpose): the gateway opens it only to send it.
type Dispatched struct {
	api.Command
	SealedSecret []byte
}

// Dispatch marks a node's pending commands dispatched and returns them, oldest first. With
// resend it also returns those dispatched before that never finished: a node that reconnects
// gets them again and recognises the ones it has seen by their ids.
func Dispatch(ctx context.Context, q postgres.Querier, nodeID string, resend bool) ([]Dispatched, error) {
	rows, err := q.Query(ctx, `UPDATE compute.commands SET state = 'dispatched',
		  dispatched_at = coalesce(dispatched_at, compute.compute_now()), attempts = attempts + 1
		WHERE node_id = $1 AND (state = 'pending' OR ($2 AND state = 'dispatched')) AND deadline > compute.compute_now()
		RETURNING secret, `+commandColumns, nodeID, resend)
	if err != nil {
		return nil, err
	}
	cmds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Dispatched, error) {
		var d Dispatched
		var args, result []byte
		c := &d.Command
		err := r.Scan(&d.SealedSecret, &c.ID, &c.TenantID, &c.NodeID, &c.Kind, &args, &c.State, &c.Deadline, &result, &c.Error, &c.Attempts,
			&c.CreatedBy, &c.CreatedAt, &c.DispatchedAt, &c.FinishedAt, &c.SecretSet)
		c.Args, c.Result = args, result
		return d, err
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(cmds, func(a, b Dispatched) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return cmds, nil
}

// Completed is what Complete recorded: the command's kind and how long it took from its
// creation to its result.
type Completed struct {
	Kind      string
	RoundTrip time.Duration
}

// Complete records a command's result with its attestation (the node's signed report of it,
// agent/v1 Attested). It reports false for a result that comes too late (the command was
// cancelled or failed its deadline) or a second time: it changes nothing then.
func Complete(ctx context.Context, q postgres.Querier, nodeID, id string, ok bool, errText string, output, attestation []byte) (Completed, bool, error) {
	state := api.CommandSucceeded
	if !ok {
		state = api.CommandFailed
	}
	if output == nil {
		output = []byte("{}")
	}
	done, err := events.EmitChanged(ctx, q, "command.finished", `UPDATE compute.commands SET state = $3, result = $4, error = $5, finished_at = compute.compute_now(), secret = NULL,
		  attestation = $6 WHERE id = $1 AND node_id = $2 AND state IN ('pending', 'dispatched') RETURNING `+finishedEvent, id, nodeID, state, output, errText, attestation)
	if err != nil || len(done) == 0 {
		return Completed{}, false, err
	}
	kind, _ := done[0]["kind"].(string)
	secs, _ := done[0]["seconds"].(float64)
	return Completed{Kind: kind, RoundTrip: time.Duration(secs * float64(time.Second))}, true, nil
}

// finishedEvent is the RETURNING list of a statement that ends commands, for their
// command.finished events (events.EmitChanged).
const finishedEvent = `tenant_id, id::text AS subject, jsonb_build_object('node', node_id, 'kind', kind, 'state', state, 'error', error,
	'seconds', extract(epoch FROM finished_at - created_at)) AS data`

// FailOverdueCommands fails the commands whose deadline passed before a result came.
func FailOverdueCommands(ctx context.Context, q postgres.Querier) (int64, error) {
	done, err := events.EmitChanged(ctx, q, "command.finished", `UPDATE compute.commands SET state = 'failed', finished_at = compute.compute_now(), secret = NULL,
		  error = CASE WHEN state = 'pending' THEN 'deadline exceeded: the node was not reached' ELSE 'deadline exceeded: the node did not report a result' END
		WHERE state IN ('pending', 'dispatched') AND deadline <= compute.compute_now() RETURNING `+finishedEvent)
	return int64(len(done)), err
}

// MarkOffline takes online nodes whose session has been silent past its grace period offline;
// their rollups' trigger then keeps anything from being placed on them.
func MarkOffline(ctx context.Context, db *postgres.DB) (int, error) {
	var n int
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		// Lock the silent nodes in id order (the order every path that changes nodes takes them),
		// then decide again in a new statement: one that waited sees the heartbeat that came
		// meanwhile, and no heartbeat is written while the locks are held.
		lrows, err := tx.Query(ctx, `SELECT n.id::text FROM compute.nodes n JOIN compute.node_sessions s ON s.node_id = n.id
			WHERE n.status = 'online' AND s.offline_after <= compute.compute_now() ORDER BY n.id FOR NO KEY UPDATE OF n`)
		if err != nil {
			return err
		}
		silent, err := pgx.CollectRows(lrows, pgx.RowTo[string])
		if err != nil || len(silent) == 0 {
			return err
		}
		srows, err := tx.Query(ctx, `SELECT node_id::text FROM compute.node_sessions
			WHERE node_id = ANY($1::uuid[]) AND offline_after <= compute.compute_now()`, silent)
		if err != nil {
			return err
		}
		still, err := pgx.CollectRows(srows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		n, err = takeOffline(ctx, tx, still, nil)
		return err
	})
	return n, err
}

// takeOffline takes the online nodes among ids offline and records each with a node.offline
// event; the caller holds their row locks. It returns how many went offline.
func takeOffline(ctx context.Context, tx pgx.Tx, ids []string, data map[string]any) (int, error) {
	gone, err := fleet.SetStatus(ctx, tx, ids, api.NodeOffline)
	if err != nil {
		return 0, err
	}
	tenants, subjects := make([]string, len(gone)), make([]string, len(gone))
	for i, node := range gone {
		tenants[i], subjects[i] = node.TenantID, node.ID
	}
	if err := events.EmitEach(ctx, tx, "node.offline", tenants, subjects, data); err != nil {
		return 0, err
	}
	return len(gone), nil
}
