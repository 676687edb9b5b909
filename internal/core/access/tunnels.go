package access

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Tunnel tickets: access.exec and access.console decide (one IAM decision) and record a
// single-use ticket; the tunnel endpoint spends it (SpendTicket) and opens the tunnel over the
// node's session.

// TicketPrefix starts every tunnel ticket.
const TicketPrefix = "bctun_"

// Events of tunnels; the subject is the node.
const (
	EventExec    = "access.exec"
	EventConsole = "access.console"
)

// tunnelTarget finds the node and the tenant a tunnel acts in: a reservation's (its holder's
// access, to a node it holds) or the node's own tenant's.
func tunnelTarget(ctx context.Context, l modules.Lookup, in api.OpenTunnel) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "node", Ref: in.Node}
	tenant := modules.TenantTarget(l.Principal, in.TenantID).TenantID
	if in.Reservation != "" {
		var resTenant string
		err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.reservations WHERE id::text = $1`, in.Reservation).Scan(&resTenant)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && resTenant != tenant {
			return t, api.NotFound("reservation", in.Reservation)
		}
		if err != nil {
			return t, err
		}
		t.TenantID, t.ResourceID = resTenant, in.Reservation
		return t, nil
	}
	err := l.Q.QueryRow(ctx, `SELECT n.id::text, n.tenant_id FROM compute.nodes n LEFT JOIN compute.pools p ON p.id = n.pool_id
		WHERE n.tenant_id = $3 AND (n.id::text = $1 OR (p.name = $2 AND n.name = $1)) LIMIT 1`, in.Node, in.Pool, tenant).Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("node", in.Node)
	}
	return t, err
}

// openTicket makes the ticket of a tunnel of kind, after the call's decision. module is a
// module's console ticket (modules.Access.ConsoleTicket): the module checked that the caller's
// tenant owns the console, and the node serves it to the ticket's reservation alone.
func openTicket(kind string, module bool) func(ctx context.Context, c *modules.Call, in api.OpenTunnel) (api.TunnelTicket, error) {
	return func(ctx context.Context, c *modules.Call, in api.OpenTunnel) (api.TunnelTicket, error) {
		if kind == "exec" && len(in.Command) == 0 {
			return api.TunnelTicket{}, api.InvalidField("command", "exec needs a command, e.g. [\"/bin/sh\"]")
		}
		if kind == "console" && !module && strings.Contains(in.Console, ":") {
			return api.TunnelTicket{}, errModuleConsole(in.Console)
		}
		var node string
		var reservation *string
		if in.Reservation != "" {
			// The holder's access: to a node the reservation holds now.
			err := c.Tx.QueryRow(ctx, `SELECT b.node_id::text FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
				JOIN compute.nodes n ON n.id = b.node_id
				WHERE r.id::text = $1 AND r.state = 'active' AND b.during @> compute.compute_now() AND ($2 = '' OR n.id::text = $2 OR n.name = $2)
				ORDER BY b.node_id LIMIT 1`, in.Reservation, in.Node).Scan(&node)
			if errors.Is(err, pgx.ErrNoRows) {
				return api.TunnelTicket{}, api.Errorf(api.CodeFailedPrecondition, "reservation %s holds no node %s now", in.Reservation, orAny(in.Node)).With("reason", "not_held")
			}
			if err != nil {
				return api.TunnelTicket{}, err
			}
			reservation = &in.Reservation
		} else {
			node = c.Target.ResourceID
		}
		root := false
		if !module {
			var err error
			if root, err = tunnelRoot(ctx, c, in, kind, node); err != nil {
				return api.TunnelTicket{}, err
			}
		}
		token := TicketPrefix + randomToken()
		h := sha256.Sum256([]byte(token))
		var expires time.Time
		if err := c.Tx.QueryRow(ctx, `INSERT INTO compute.access_tickets (id, token_hash, tenant_id, principal, node_id, reservation_id, kind, argv, tty, cols, rows, console,
			root, break_glass, reason, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $14, $15, $16, compute.compute_now() + make_interval(secs => $13)) RETURNING expires_at`,
			uuid.Must(uuid.NewV7()).String(), h[:], c.Target.TenantID, c.Principal.ID, node, reservation, kind, nonNil(in.Command), in.TTY, in.Cols, in.Rows,
			in.Console, api.TicketTTL.Seconds(), root, in.BreakGlass, in.Reason).Scan(&expires); err != nil {
			return api.TunnelTicket{}, err
		}
		typ, data := EventExec, map[string]any{"reservation": in.Reservation, "node": node, "principal": c.Principal.ID, "root": root}
		if kind == "exec" {
			data["command"], data["tty"] = in.Command, in.TTY
		} else {
			typ, data["console"] = EventConsole, in.Console
		}
		if in.BreakGlass {
			// One event still, as a break-glass certificate is: access.break_glass, with the reason.
			typ, data["kind"], data["reason"] = EventBreakGlass, kind, in.Reason
		}
		// A holder's ticket is about its reservation, as its certificates are: the reservation's
		// events list every way in. An operator's ticket to a node is about the node.
		subject := cmp.Or(in.Reservation, node)
		if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: typ, TenantID: c.Target.TenantID, Subject: subject, Data: data}); err != nil {
			return api.TunnelTicket{}, err
		}
		out := api.TunnelTicket{Ticket: token, URL: api.BasePath + api.TunnelPath + "?ticket=" + url.QueryEscape(token), Node: node,
			Reservation: in.Reservation, ExpiresAt: expires, Root: root}
		if !root && kind == "exec" {
			out.User = api.ReservationUser(in.Reservation)
		}
		return out, nil
	}
}

// Service is modules.Access.
type Service struct{}

// ConsoleTicket implements modules.Access.
func (Service) ConsoleTicket(ctx context.Context, c *modules.Call, in api.OpenTunnel) (api.TunnelTicket, error) {
	if err := in.Validate(); err != nil {
		return api.TunnelTicket{}, err
	}
	if in.Reservation == "" {
		return api.TunnelTicket{}, api.InvalidField("reservation", "a module's console ticket is its holder's: name the reservation")
	}
	if in.BreakGlass {
		return api.TunnelTicket{}, api.InvalidField("breakGlass", "a module's console is its owner's: break-glass is for a node's own")
	}
	return openTicket("console", true)(ctx, c, in)
}

// SSHCA implements modules.Access.
func (Service) SSHCA(ctx context.Context, c *modules.Call) (string, error) {
	_, ca, err := authority(ctx, c)
	return ca.PublicKey, err
}

func orAny(s string) string {
	if s == "" {
		return "(any)"
	}
	return s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Ticket is a spent ticket: the tunnel it opens.
type Ticket struct {
	Tenant, Principal, Node, Reservation string
	Kind                                 string // exec or console
	Argv                                 []string
	TTY                                  bool
	Cols, Rows                           int
	Console                              string
	// Root: the command runs as the user bcd runs as and the node's own consoles open (a
	// holder of the whole node, or an operator); otherwise an exec runs as the reservation's
	// own user.
	Root bool
	// BreakGlass: an operator's root by the reservation, not the holder's own.
	BreakGlass bool
}

// ErrTicket is a ticket that opens nothing: unknown, used, expired, or of a reservation that no
// longer holds its node. The endpoint answers it as unauthenticated.
var ErrTicket = errors.New("access: the ticket is unknown, used or expired")

// SpendTicket spends a ticket, once: a second use, a late one, or one whose reservation no
// longer holds the node opens nothing.
func SpendTicket(ctx context.Context, db *postgres.DB, token string) (Ticket, error) {
	var t Ticket
	if !strings.HasPrefix(token, TicketPrefix) {
		return t, ErrTicket
	}
	h := sha256.Sum256([]byte(token))
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		var reservation *string
		err := tx.QueryRow(ctx, `UPDATE compute.access_tickets SET used_at = compute.compute_now()
			WHERE token_hash = $1 AND used_at IS NULL AND expires_at > compute.compute_now()
			RETURNING tenant_id, principal, node_id::text, reservation_id::text, kind, argv, tty, cols, rows, console, root, break_glass`, h[:]).
			Scan(&t.Tenant, &t.Principal, &t.Node, &reservation, &t.Kind, &t.Argv, &t.TTY, &t.Cols, &t.Rows, &t.Console, &t.Root, &t.BreakGlass)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrTicket
		}
		if err != nil || reservation == nil {
			return err
		}
		t.Reservation = *reservation
		var held bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
			WHERE r.id = $1 AND r.state = 'active' AND b.node_id = $2 AND b.during @> compute.compute_now())`, t.Reservation, t.Node).Scan(&held); err != nil {
			return err
		}
		if !held {
			return fmt.Errorf("%w: reservation %s no longer holds the node", ErrTicket, t.Reservation)
		}
		if t.Root && !t.BreakGlass {
			// Root was the whole node's: another reservation may have come since the ticket.
			whole, err := wholeNode(ctx, tx, t.Reservation, t.Node)
			if err != nil {
				return err
			}
			if !whole {
				return fmt.Errorf("%w: %w", ErrTicket, errNotWhole)
			}
		}
		return nil
	})
	return t, err
}

// registerTunnels registers the tunnel methods.
func registerTunnels(r *modules.Registry) {
	r.EventTypes(
		modules.EventType{Name: EventExec, Description: "A ticket to run a command on a node was made (data: reservation, node, principal, root, command, tty); with break-glass it is an access.break_glass event."},
		modules.EventType{Name: EventConsole, Description: "A ticket to a node's console was made (data: reservation, node, principal, root, console); with break-glass it is an access.break_glass event."},
	)
	modules.Handle(r, api.AccessExec, tunnelTarget, openTicket("exec", false))
	modules.Handle(r, api.AccessConsole, tunnelTarget, openTicket("console", false))
	r.Worker(modules.Worker{Name: "access-tickets", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, time.Minute, func() error {
			_, err := rt.DB.Pool.Exec(ctx, `DELETE FROM compute.access_tickets WHERE expires_at < compute.compute_now() - interval '1 hour'`)
			return err
		})
	}})
}
