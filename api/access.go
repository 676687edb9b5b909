package api

import (
	"strings"
	"time"
)

// ResourceAccess is the IAM resource type of SSH access.
const ResourceAccess = "compute-access"

// The access group: short-lived SSH certificates for the holders of reservations (docs/access.md).
var (
	AccessSSHCA          = NewMethod[GetSSHCA, SSHCA]("access", "sshCA", true, ResourceAccess, "v0.3", "The tenant's SSH certificate authority's public key, for sshd's TrustedUserCAKeys (made on first use).")
	AccessSSHCertificate = NewMethod[SignSSHKey, SSHCertificate]("access", "sshCertificate", true, ResourceAccess, "v0.3", "Sign an SSH public key for minutes, for the nodes of an active reservation; break-glass access needs a reason.")
	AccessRevoke         = NewMethod[RevokeSSHCertificate, RevokedSSHCertificate]("access", "revoke", true, ResourceAccess, "v0.3", "Revoke an SSH certificate before it expires: the nodes' sshd refuse it from their next desired state.")
)

// AccessMethods returns the access group.
func AccessMethods() []MethodInfo { return infos(accessTable()) }

func accessTable() []Describer { return []Describer{AccessSSHCA, AccessSSHCertificate, AccessRevoke} }

// Bounds of SSH certificates.
const (
	DefaultSSHCertTTL = 15 * time.Minute
	MinSSHCertTTL     = 10 * time.Second
	MaxSSHCertTTL     = 8 * time.Hour
)

// GetSSHCA is the input of access.sshCA.
type GetSSHCA struct {
	TenantID string `json:"tenantId,omitempty"`
}

// Validate implements the input check.
func (GetSSHCA) Validate() error { return nil }

// SSHCA is a tenant's SSH certificate authority.
type SSHCA struct {
	TenantID  string    `json:"tenantId"`
	PublicKey string    `json:"publicKey"` // authorized_keys form: a line of TrustedUserCAKeys
	CreatedAt time.Time `json:"createdAt"`
}

// SignSSHKey is the input of access.sshCertificate.
type SignSSHKey struct {
	TenantID    string `json:"tenantId,omitempty"`
	Reservation string `json:"reservation"`
	PublicKey   string `json:"publicKey"`     // authorized_keys form, e.g. ssh-ed25519 AAAA… user@host
	TTL         string `json:"ttl,omitempty"` // default 15m, 10s to 8h; never past the reservation's end
	// BreakGlass asks for access as an operator's emergency: its Reason is required and the
	// certificate is an access.break_glass event.
	BreakGlass bool   `json:"breakGlass,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// Validate implements the input check.
func (in SignSSHKey) Validate() error {
	if in.Reservation == "" {
		return InvalidField("reservation", "is required: the reservation whose nodes the certificate opens")
	}
	if in.PublicKey == "" || len(in.PublicKey) > 16<<10 || !strings.HasPrefix(in.PublicKey, "ssh-") && !strings.HasPrefix(in.PublicKey, "ecdsa-") {
		return InvalidField("publicKey", "must be an SSH public key in authorized_keys form (ssh-ed25519 AAAA…)")
	}
	if _, err := in.Lifetime(); err != nil {
		return err
	}
	if in.BreakGlass && strings.TrimSpace(in.Reason) == "" {
		return InvalidField("reason", "is required for break-glass access: say why")
	}
	return ValidateText("reason", in.Reason, MaxDescription)
}

// Lifetime is the certificate's asked lifetime.
func (in SignSSHKey) Lifetime() (time.Duration, error) {
	if in.TTL == "" {
		return DefaultSSHCertTTL, nil
	}
	d, err := ParseDuration("ttl", in.TTL)
	if err != nil {
		return 0, err
	}
	if d < MinSSHCertTTL || d > MaxSSHCertTTL {
		return 0, InvalidField("ttl", "%s is outside %s to %s", in.TTL, MinSSHCertTTL, MaxSSHCertTTL)
	}
	return d, nil
}

// SSHCertificate is a signed certificate.
type SSHCertificate struct {
	Certificate string    `json:"certificate"` // authorized_keys form: save it as id_ed25519-cert.pub
	Serial      int64     `json:"serial"`
	KeyID       string    `json:"keyId"`
	Principals  []string  `json:"principals"`
	ValidAfter  time.Time `json:"validAfter"`
	ValidBefore time.Time `json:"validBefore"`
}

// ReservationPrincipal is the SSH principal of a reservation: a node's sshd lets certificates of
// it in while the reservation holds the node.
func ReservationPrincipal(reservationID string) string { return "res-" + reservationID }

// RevokeSSHCertificate is the input of access.revoke.
type RevokeSSHCertificate struct {
	TenantID string `json:"tenantId,omitempty"`
	Serial   int64  `json:"serial" input:"int8"`
}

// Validate implements the input check.
func (in RevokeSSHCertificate) Validate() error {
	if in.Serial <= 0 {
		return InvalidField("serial", "must be a certificate's serial (access.sshCertificate's answer)")
	}
	return nil
}

// RevokedSSHCertificate answers access.revoke.
type RevokedSSHCertificate struct {
	Serial      int64     `json:"serial"`
	Reservation string    `json:"reservation"`
	RevokedAt   time.Time `json:"revokedAt"`
}

// SSHAccessKind is the desired-state part that opens a node's sshd to the holders of its
// reservations (version SSHAccessVersion): optional, since a node may run no sshd.
const (
	SSHAccessKind    = "access.ssh"
	SSHAccessVersion = 1
)

// SSHAccess is a node's SSH access: the certificate authorities of the tenants whose
// reservations hold it now (TrustedUserCAKeys), the principals those reservations' certificates
// carry (the login user's AuthorizedPrincipalsFile), and the revocation list (RevokedKeys, an
// OpenSSH KRL): the certificates revoked, or whose reservation ended, before they expire.
type SSHAccess struct {
	CAKeys     []string `json:"caKeys"`
	Principals []string `json:"principals"`
	KRL        []byte   `json:"krl"`
}
