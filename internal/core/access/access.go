// Package access signs short-lived SSH certificates for the holders of reservations, with a
// certificate authority per tenant whose private key is sealed with the secret and bound to the
// tenant. A node's sshd trusts the tenant's CA (TrustedUserCAKeys) and lets in the principal of
// each reservation that holds it (docs/access.md).
package access

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the access schema.
var Migrations = postgres.EmbeddedMigrations("access", "compute", migrationsFS)

// The access events; the subject of each is the reservation.
const (
	EventCertificate = "access.ssh_certificate"
	EventBreakGlass  = "access.break_glass"
	EventRevoked     = "access.revoked"
)

// Module is SSH access.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "access" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceAccess, Description: "SSH access to the nodes of reservations: the tenant's CA and the certificates it signs."})
	r.Actions(modules.ActionsFor(api.AccessMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventCertificate, Description: "An SSH certificate was signed for a reservation's nodes (data: serial, keyId, principals, validBefore, fingerprint)."},
		modules.EventType{Name: EventBreakGlass, Description: "Break-glass access, with its reason: an SSH certificate that logs in as root (data as access.ssh_certificate, reason), or a tunnel ticket (data as access.exec or access.console, kind (exec or console), reason)."},
		modules.EventType{Name: EventRevoked, Description: "An SSH certificate was revoked (data: serial)."},
	)
	r.DesiredKind(modules.DesiredKind{Name: api.SSHAccessKind, Version: api.SSHAccessVersion, Optional: true, State: sshAccess})
	modules.Handle(r, api.AccessSSHCA, nil, func(ctx context.Context, c *modules.Call, _ api.GetSSHCA) (api.SSHCA, error) {
		_, ca, err := authority(ctx, c)
		return ca, err
	})
	modules.Handle(r, api.AccessSSHCertificate, nil, sign)
	modules.Handle(r, api.AccessRevoke, nil, revoke)
	registerTunnels(r)
	return nil
}

func purpose(tenant string) string { return "ssh-ca:" + tenant }

// authority returns the tenant's CA, made (and sealed) on its first use.
func authority(ctx context.Context, c *modules.Call) (ssh.Signer, api.SSHCA, error) {
	ca := api.SSHCA{TenantID: c.Target.TenantID}
	sealed, err := readAuthority(ctx, c.Tx, &ca)
	if errors.Is(err, pgx.ErrNoRows) {
		if err = createAuthority(ctx, c, ca.TenantID); err == nil {
			sealed, err = readAuthority(ctx, c.Tx, &ca)
		}
	}
	if err != nil {
		return nil, ca, err
	}
	seed, err := c.Runtime.Secrets.Open(purpose(ca.TenantID), sealed)
	if err != nil {
		return nil, ca, fmt.Errorf("access: open the SSH CA of %s: %w", ca.TenantID, err)
	}
	signer, err := ssh.NewSignerFromKey(ed25519.NewKeyFromSeed(seed))
	return signer, ca, err
}

func readAuthority(ctx context.Context, tx pgx.Tx, ca *api.SSHCA) (sealed []byte, err error) {
	err = tx.QueryRow(ctx, `SELECT public_key, private_key, created_at FROM compute.access_ssh_cas WHERE tenant_id = $1`, ca.TenantID).
		Scan(&ca.PublicKey, &sealed, &ca.CreatedAt)
	return sealed, err
}

// createAuthority makes a tenant's CA. Two first uses at once: one CA wins, and both read it.
func createAuthority(ctx context.Context, c *modules.Call, tenant string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return err
	}
	sealed, err := c.Runtime.Secrets.Seal(purpose(tenant), priv.Seed())
	if err != nil {
		return err
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))) + " better-compute-" + tenant
	_, err = c.Tx.Exec(ctx, `INSERT INTO compute.access_ssh_cas (tenant_id, public_key, private_key) VALUES ($1, $2, $3)
		ON CONFLICT (tenant_id) DO NOTHING`, tenant, pub, sealed)
	return err
}

// sign signs the caller's key for an active reservation of the tenant, for the reservation's
// principal, until the earlier of the TTL and the reservation's end.
func sign(ctx context.Context, c *modules.Call, in api.SignSSHKey) (api.SSHCertificate, error) {
	key, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(in.PublicKey))
	if err != nil {
		return api.SSHCertificate{}, api.InvalidField("publicKey", "is not an SSH public key: %v", err)
	}
	if _, isCert := key.(*ssh.Certificate); isCert {
		return api.SSHCertificate{}, api.InvalidField("publicKey", "is a certificate; give the public key itself")
	}
	ttl, _ := in.Lifetime()
	var state string
	var ends *time.Time
	var now time.Time
	err = c.Tx.QueryRow(ctx, `SELECT state, ends_at, compute.compute_now() FROM compute.reservations WHERE id::text = $1 AND tenant_id = $2`,
		in.Reservation, c.Target.TenantID).Scan(&state, &ends, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.SSHCertificate{}, api.NotFound("reservation", in.Reservation)
	}
	if err != nil {
		return api.SSHCertificate{}, err
	}
	if state != api.ReservationActive {
		return api.SSHCertificate{}, api.Errorf(api.CodeFailedPrecondition, "the reservation is %s: certificates are for active reservations", state).With("reason", "not_active")
	}
	before := now.Add(ttl)
	if ends != nil && ends.Before(before) {
		before = *ends
	}
	after := now.Add(-time.Minute) // clocks of nodes a little behind
	ca, _, err := authority(ctx, c)
	if err != nil {
		return api.SSHCertificate{}, err
	}
	principals := []string{api.ReservationPrincipal(in.Reservation)}
	keyID := c.Principal.ID + "/" + in.Reservation
	if in.BreakGlass {
		// Root on the reservation's nodes: only for their operators, never for a tenant that
		// holds part of a node (it would reach the other tenants' work there).
		nodes, err := reservationNodes(ctx, c.Tx, in.Reservation)
		if err != nil {
			return api.SSHCertificate{}, err
		}
		if err := operatorOf(ctx, c, nodes...); err != nil {
			return api.SSHCertificate{}, err
		}
		keyID = "break-glass/" + keyID
		principals = append(principals, api.BreakGlassPrincipal(in.Reservation))
	}
	var serial int64
	fingerprint := ssh.FingerprintSHA256(key)
	if err := c.Tx.QueryRow(ctx, `INSERT INTO compute.access_certificates (tenant_id, reservation_id, key_id, principals, fingerprint, valid_after, valid_before, break_glass, reason, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING serial`,
		c.Target.TenantID, in.Reservation, keyID, principals, fingerprint, after, before, in.BreakGlass, in.Reason, c.Principal.ID).Scan(&serial); err != nil {
		return api.SSHCertificate{}, err
	}
	cert := &ssh.Certificate{
		Key: key, Serial: uint64(serial), CertType: ssh.UserCert, KeyId: keyID, ValidPrincipals: principals,
		ValidAfter: uint64(after.Unix()), ValidBefore: uint64(before.Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{"permit-pty": ""}},
	}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		return api.SSHCertificate{}, fmt.Errorf("access: sign: %w", err)
	}
	out := api.SSHCertificate{
		Certificate: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert))) + commentOf(comment),
		Serial:      serial, KeyID: keyID, Principals: principals, ValidAfter: after.UTC(), ValidBefore: before.UTC(),
		User: api.ReservationUser(in.Reservation),
	}
	data := map[string]any{"reservation": in.Reservation, "principal": c.Principal.ID, "serial": serial, "keyId": keyID, "principals": principals, "validBefore": out.ValidBefore.Format(time.RFC3339), "fingerprint": fingerprint}
	typ := EventCertificate
	if in.BreakGlass {
		typ, data["reason"] = EventBreakGlass, in.Reason
	}
	// The reservation's nodes trust the tenant's CA from the first certificate on.
	if err := bumpReservation(ctx, c, in.Reservation); err != nil {
		return out, err
	}
	return out, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: typ, TenantID: c.Target.TenantID, Subject: in.Reservation, Data: data})
}

func commentOf(c string) string {
	if c == "" {
		return ""
	}
	return " " + c
}
