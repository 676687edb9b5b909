package access

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/lib/sshkrl"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// What a node's sshd is given (the desired-state part api.SSHAccessKind): the CAs, principals and
// revocations of the reservations that hold it now. A booking that starts or ends moves the
// node's generation already (the bookings' triggers); a certificate revoked, or a tenant's first
// CA, moves the nodes of its reservation (bumpReservation).

// sshAccess is a node's part: nil when no reservation holds it, which empties its sshd's files.
func sshAccess(ctx context.Context, q postgres.Querier, node string) (any, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT r.id::text, r.tenant_id FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE b.node_id = $1 AND b.during @> compute.compute_now() AND r.state = 'active' ORDER BY 1`, node)
	if err != nil {
		return nil, err
	}
	var holders, tenants []string
	seen := map[string]bool{}
	for rows.Next() {
		var res, tenant string
		if err := rows.Scan(&res, &tenant); err != nil {
			rows.Close()
			return nil, err
		}
		holders = append(holders, res)
		if !seen[tenant] {
			seen[tenant] = true
			tenants = append(tenants, tenant)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(holders) == 0 {
		return nil, nil
	}
	// Each holder logs in as its own user; a holder of the whole node, and a break-glass
	// certificate's principal, as the node's operator login too.
	out := api.SSHAccess{Principals: []string{}, CAKeys: []string{}}
	for _, res := range holders {
		out.Holders = append(out.Holders, api.SSHHolder{Reservation: res, Principals: []string{api.ReservationPrincipal(res)}})
		whole, err := wholeNode(ctx, q, res, node)
		if err != nil {
			return nil, err
		}
		if whole {
			out.Principals = append(out.Principals, api.ReservationPrincipal(res))
		}
	}
	rows, err = q.Query(ctx, `SELECT DISTINCT reservation_id::text FROM compute.access_certificates
		WHERE reservation_id::text = ANY($1) AND break_glass AND revoked_at IS NULL AND valid_before > compute.compute_now() ORDER BY 1`, holders)
	if err != nil {
		return nil, err
	}
	glass, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, res := range glass {
		out.Principals = append(out.Principals, api.BreakGlassPrincipal(res))
	}
	cas := map[string]ssh.PublicKey{}
	rows, err = q.Query(ctx, `SELECT tenant_id, public_key FROM compute.access_ssh_cas WHERE tenant_id = ANY($1) ORDER BY tenant_id`, tenants)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var tenant, line string
		if err := rows.Scan(&tenant, &line); err != nil {
			rows.Close()
			return nil, err
		}
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("access: the SSH CA of %s: %w", tenant, err)
		}
		out.CAKeys = append(out.CAKeys, line)
		cas[tenant] = key
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Revoked, or of a reservation no longer active, and not expired yet.
	rows, err = q.Query(ctx, `SELECT c.tenant_id, c.serial FROM compute.access_certificates c
		LEFT JOIN compute.reservations r ON r.id = c.reservation_id
		WHERE c.tenant_id = ANY($1) AND c.valid_before > compute.compute_now()
		  AND (c.revoked_at IS NOT NULL OR r.state IS DISTINCT FROM 'active') ORDER BY c.serial`, tenants)
	if err != nil {
		return nil, err
	}
	byTenant := map[string][]uint64{}
	var version uint64
	for rows.Next() {
		var tenant string
		var serial int64
		if err := rows.Scan(&tenant, &serial); err != nil {
			rows.Close()
			return nil, err
		}
		if cas[tenant] != nil {
			byTenant[tenant] = append(byTenant[tenant], uint64(serial))
			version = max(version, uint64(serial))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// The KRL's date is fixed by its content, so that an unchanged list is the same bytes.
	var revoked []sshkrl.Revoked
	for tenant, serials := range byTenant {
		revoked = append(revoked, sshkrl.Revoked{CA: cas[tenant], Serials: serials})
	}
	out.KRL = sshkrl.Write(version, time.Unix(0, 0), revoked)
	return out, nil
}

// bumpReservation moves the desired state of the nodes a reservation holds.
func bumpReservation(ctx context.Context, c *modules.Call, reservation string) error {
	rows, err := c.Tx.Query(ctx, `SELECT DISTINCT node_id::text FROM compute.bookings WHERE reservation_id::text = $1`, reservation)
	if err != nil {
		return err
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	return c.Runtime.Nodes.BumpDesired(ctx, c.Tx, nodes...)
}

// revoke revokes a certificate of the tenant: it is in its nodes' KRL from their next state.
func revoke(ctx context.Context, c *modules.Call, in api.RevokeSSHCertificate) (api.RevokedSSHCertificate, error) {
	out := api.RevokedSSHCertificate{Serial: in.Serial}
	err := c.Tx.QueryRow(ctx, `UPDATE compute.access_certificates SET revoked_at = coalesce(revoked_at, compute.compute_now()), revoked_by = $3
		WHERE serial = $1 AND tenant_id = $2 RETURNING reservation_id::text, revoked_at`, in.Serial, c.Target.TenantID, c.Principal.ID).
		Scan(&out.Reservation, &out.RevokedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, api.NotFound("SSH certificate", fmt.Sprint(in.Serial))
	}
	if err != nil {
		return out, err
	}
	if err := bumpReservation(ctx, c, out.Reservation); err != nil {
		return out, err
	}
	return out, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventRevoked, TenantID: c.Target.TenantID, Subject: out.Reservation,
		Data: map[string]any{"serial": in.Serial}})
}
