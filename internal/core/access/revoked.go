package access

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/internal/lib/sshkrl"
	"github.com/better-compute/compute/postgres"
)

// SSHRevoked implements modules.Access: the KRL of one reservation's certificates, for a guest
// that trusts the tenant's CA for that reservation's principal alone. Its rows are those of
// sshAccess's KRL that name the reservation, so a node's sshd and a sandbox's guest refuse the
// same certificates.
func (Service) SSHRevoked(ctx context.Context, q postgres.Querier, reservation string) ([]byte, error) {
	rows, err := q.Query(ctx, `SELECT ca.public_key, c.serial FROM compute.access_certificates c
		JOIN compute.access_ssh_cas ca ON ca.tenant_id = c.tenant_id
		LEFT JOIN compute.reservations r ON r.id = c.reservation_id
		WHERE c.reservation_id::text = $1 AND c.valid_before > compute.compute_now()
		  AND (c.revoked_at IS NOT NULL OR r.state IS DISTINCT FROM 'active') ORDER BY c.serial`, reservation)
	if err != nil {
		return nil, err
	}
	type row struct {
		ca     string
		serial int64
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.ca, &x.serial)
	})
	if err != nil {
		return nil, err
	}
	var revoked []sshkrl.Revoked
	var version uint64
	for _, x := range found {
		if len(revoked) == 0 {
			ca, _, _, _, err := ssh.ParseAuthorizedKey([]byte(x.ca))
			if err != nil {
				return nil, err
			}
			revoked = append(revoked, sshkrl.Revoked{CA: ca})
		}
		revoked[0].Serials = append(revoked[0].Serials, uint64(x.serial))
		version = max(version, uint64(x.serial))
	}
	// Dated by its content, as a node's: the same revocations are the same bytes.
	return sshkrl.Write(version, time.Unix(0, 0), revoked), nil
}
