package access

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Tenants sharing a node (docs/security.md): a holder of part of a node reaches it as its
// reservation's own unprivileged user (api.ReservationUser), which bcd makes and confines;
// root, and the node's own consoles, are for a holder of the whole node and for the node's
// operators (its tenant or an ancestor of it), who need break-glass with a reason while
// reservations hold the node.

// wholeNode reports whether reservation holds the whole of node now: no other reservation
// holds any of it, and the reservation holds every GPU of it whole (a node without GPUs: every
// vCPU).
func wholeNode(ctx context.Context, q postgres.Querier, reservation, node string) (bool, error) {
	var whole bool
	err := q.QueryRow(ctx, `WITH now AS (SELECT compute.compute_now() AS t),
		mine AS (SELECT b.resource, b.atoms FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id CROSS JOIN now
			WHERE r.id::text = $1 AND r.state = 'active' AND b.node_id::text = $2 AND b.during @> now.t)
		SELECT EXISTS (SELECT 1 FROM mine)
		  AND NOT EXISTS (SELECT 1 FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id CROSS JOIN now
			WHERE b.node_id::text = $2 AND b.during @> now.t AND r.state = 'active' AND r.id::text <> $1)
		  AND NOT EXISTS (SELECT 1 FROM compute.devices d WHERE d.node_id::text = $2
			AND NOT EXISTS (SELECT 1 FROM mine WHERE mine.resource = 'gpu' AND mine.atoms @> int4range(d.index * 64, d.index * 64 + 64)))
		  AND (EXISTS (SELECT 1 FROM compute.devices d WHERE d.node_id::text = $2)
			OR (SELECT coalesce(sum(upper(atoms) - lower(atoms)), 0) FROM mine WHERE resource = 'cpu')
			   >= coalesce((SELECT nullif(vcpus_total, 0) FROM compute.node_capacity WHERE node_id::text = $2), 2147483647))`,
		reservation, node).Scan(&whole)
	return whole, err
}

// heldByAny reports whether any active reservation holds part of node now.
func heldByAny(ctx context.Context, q postgres.Querier, node string) (bool, error) {
	var held bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE b.node_id::text = $1 AND b.during @> compute.compute_now() AND r.state = 'active')`, node).Scan(&held)
	return held, err
}

// operatorOf checks that the caller is an operator of each of nodes: a principal of the node's
// tenant or of an ancestor of it. The call's target tenant path (its tenant and ancestors,
// nearest first) holds the caller's tenant (the envelope's pre-check) and, for a reservation in
// a pool of an ancestor, the node's tenant: the caller operates the node when its tenant is the
// node's or above it.
func operatorOf(ctx context.Context, c *modules.Call, nodes ...string) error {
	if len(nodes) == 0 {
		return api.Errorf(api.CodeFailedPrecondition, "the reservation holds no node now: break-glass access is to its nodes").With("reason", "not_held")
	}
	rows, err := c.Tx.Query(ctx, `SELECT id::text, tenant_id FROM compute.nodes WHERE id::text = ANY($1)`, nodes)
	if err != nil {
		return err
	}
	owners, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Node, Tenant string }])
	if err != nil {
		return err
	}
	caller := c.Principal.TenantID
	at := slices.Index(c.Target.TenantPath, caller)
	for _, o := range owners {
		n := slices.Index(c.Target.TenantPath, o.Tenant)
		if caller == o.Tenant || at >= 0 && n >= 0 && at >= n {
			continue
		}
		return api.Errorf(api.CodePermissionDenied, "break-glass access to node %s is for its operators (tenant %s or an ancestor of it), not tenant %s",
			o.Node, o.Tenant, caller).With("reason", "not_operator")
	}
	return nil
}

// reservationNodes lists the nodes a reservation holds now.
func reservationNodes(ctx context.Context, q postgres.Querier, reservation string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT b.node_id::text FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE r.id::text = $1 AND r.state = 'active' AND b.during @> compute.compute_now() ORDER BY 1`, reservation)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// errModuleConsole refuses, at access.console, a console a module serves (its name is
// "kind:id", such as the vps module's instance:<id>): only the module knows its owner, and it
// makes the ticket itself (modules.Access.ConsoleTicket) once it has checked the caller's
// tenant owns it.
func errModuleConsole(name string) error {
	return api.InvalidField("console", "%q is a console a module serves for its owner: open it with that module's method "+
		"(instances.console, sandboxes.console), which checks that it is yours", name)
}

// tunnelRoot decides whether a tunnel of kind to node runs as root (exec) or may open the
// node's own consoles (console): a holder of the whole node, an operator by the node (with
// break-glass while reservations hold it), or an operator with break-glass by a reservation.
// A holder of part of the node gets no root: its exec runs as its own user, and the node's
// consoles are refused to it.
func tunnelRoot(ctx context.Context, c *modules.Call, in api.OpenTunnel, kind, node string) (bool, error) {
	if in.Reservation == "" { // the node's own tenant (tunnelTarget): an operator
		if kind == "console" {
			return true, nil
		}
		held, err := heldByAny(ctx, c.Tx, node)
		if err != nil {
			return false, err
		}
		if held && !in.BreakGlass {
			return false, api.InvalidField("breakGlass", "node %s is held by reservations: an operator's command there runs as root over "+
				"their work, which is break-glass access: give breakGlass and a reason", node)
		}
		return true, nil
	}
	if in.BreakGlass {
		if err := operatorOf(ctx, c, node); err != nil {
			return false, err
		}
		return true, nil
	}
	whole, err := wholeNode(ctx, c.Tx, in.Reservation, node)
	if err != nil {
		return false, fmt.Errorf("access: is node %s held whole: %w", node, err)
	}
	if kind == "console" && !whole {
		return false, api.Errorf(api.CodePermissionDenied, "the consoles of node %s are its own, for a holder of the whole node or its operators: "+
			"reservation %s holds part of it", node, in.Reservation).With("reason", "partial_hold")
	}
	return whole, nil
}

// errNotWhole is a root ticket whose reservation no longer holds the whole node when it is spent.
var errNotWhole = errors.New("the reservation no longer holds the whole node")
