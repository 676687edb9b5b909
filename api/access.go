package api

import (
	"crypto/sha256"
	"encoding/hex"
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

func accessTable() []Describer {
	return []Describer{AccessSSHCA, AccessSSHCertificate, AccessRevoke, AccessExec, AccessConsole}
}

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
	// BreakGlass asks for access as an operator's emergency: root (the node's operator login)
	// on the reservation's nodes, for a caller who is an operator of each of them (of the
	// node's tenant or an ancestor of it; others are refused). Its Reason is required and the
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
	// User is the login user on the reservation's nodes: the reservation's own
	// (ReservationUser). A break-glass certificate logs in as the node's operator login as well
	// (bcd node --ssh-user, root by default), as does any certificate of a reservation that
	// holds the whole node.
	User string `json:"user"`
}

// ReservationPrincipal is the SSH principal of a reservation: a node's sshd lets certificates of
// it in, as the reservation's own user (ReservationUser), while the reservation holds the node.
func ReservationPrincipal(reservationID string) string { return "res-" + reservationID }

// BreakGlassPrincipal is the SSH principal of a break-glass certificate of a reservation: a
// node the reservation holds lets it in as the node's operator login (root) while the
// certificate is valid. Only an operator of the node (its tenant or an ancestor) gets one.
func BreakGlassPrincipal(reservationID string) string { return "root-res-" + reservationID }

// ReservationUser is the unprivileged user a reservation's commands and SSH logins run as on a
// node it holds part of: "bc-" and 12 hex digits of the SHA-256 of its id (a login name of at
// most 32 characters, the same on every node, and not guessable from another reservation's).
// bcd makes it while the reservation holds the node and removes it, its processes and its
// files, when the hold ends.
func ReservationUser(reservationID string) string {
	sum := sha256.Sum256([]byte(reservationID))
	return "bc-" + hex.EncodeToString(sum[:6])
}

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
// reservations hold it now (TrustedUserCAKeys), which principals log in as which user (each
// user's AuthorizedPrincipalsFile), and the revocation list (RevokedKeys, an OpenSSH KRL): the
// certificates revoked, or whose reservation ended, before they expire.
type SSHAccess struct {
	CAKeys []string `json:"caKeys"`
	// Principals log in as the node's operator login (bcd node --ssh-user, root by default):
	// those of a reservation that holds the whole node, and break-glass principals
	// (BreakGlassPrincipal) of certificates an operator of the node holds. A bcd that predates
	// Holders reads this field alone, so a holder of part of the node is never in it.
	Principals []string `json:"principals"`
	// Holders are the reservations that hold the node now, each logging in as its own user
	// (ReservationUser), which the node makes.
	Holders []SSHHolder `json:"holders,omitempty"`
	KRL     []byte      `json:"krl"`
}

// SSHHolder is a reservation's SSH login on a node: its principals log in as its own user.
type SSHHolder struct {
	Reservation string   `json:"reservation"`
	Principals  []string `json:"principals"`
}

// The tunnel methods: a single-use ticket to a command run on a node, or to its console, over
// the node's session (docs/access.md).
var (
	AccessExec    = NewMethod[OpenTunnel, TunnelTicket]("access", "exec", true, ResourceAccess, "v0.3", "A single-use ticket to run a command on a node (a node a reservation of yours holds, or one of your nodes), over its session.")
	AccessConsole = NewMethod[OpenTunnel, TunnelTicket]("access", "console", true, ResourceAccess, "v0.3", "A single-use ticket to a node's console, over its session.")
)

// TunnelPath is where a ticket opens its tunnel: GET BasePath+TunnelPath?ticket=…, a WebSocket.
const TunnelPath = "/access/tunnel"

// The tunnel's WebSocket carries binary messages, each a frame type byte and its payload.
const (
	// FrameData: from the holder, bytes for the command's standard input; to the holder, its
	// standard output (a terminal's or a console's whole output).
	FrameData byte = 0
	// FrameResize, from the holder: the terminal's new size, JSON TunnelSize.
	FrameResize byte = 1
	// FrameExit, to the holder, last: JSON TunnelExit; the server then closes the WebSocket.
	FrameExit byte = 2
	// FrameStderr, to the holder: the command's standard error (without a terminal).
	FrameStderr byte = 3
	// FrameEOF, from the holder: the end of standard input.
	FrameEOF byte = 4
)

// TunnelSize is a FrameResize's payload.
type TunnelSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// TunnelExit is a FrameExit's payload: the command's exit code, or -1 and why the tunnel ended
// without one (the console closed, the reservation ended, the node's session ended).
type TunnelExit struct {
	ExitCode int    `json:"exitCode"`
	Error    string `json:"error,omitempty"`
}

// TicketTTL is how long a ticket may wait to be used.
const TicketTTL = time.Minute

// OpenTunnel is the input of access.exec and access.console.
type OpenTunnel struct {
	TenantID string `json:"tenantId,omitempty"`
	// Node is the node (its id, or its name with Pool); with Reservation alone, the
	// reservation's first node.
	Node string `json:"node,omitempty"`
	Pool string `json:"pool,omitempty"`
	// Reservation opens the tunnel as its holder, to a node it holds: the tunnel ends when the
	// reservation no longer holds the node. Without it, only the node's own tenant may.
	Reservation string   `json:"reservation,omitempty"`
	Command     []string `json:"command,omitempty"` // exec: the command and its arguments
	TTY         bool     `json:"tty,omitempty"`     // exec: in a pseudo-terminal
	Cols        int      `json:"cols,omitempty"`
	Rows        int      `json:"rows,omitempty"`
	Console     string   `json:"console,omitempty"` // console: which (default the node's)
	// BreakGlass asks, as an operator of the node (its tenant or an ancestor of it), for its
	// commands to run as root on a node that tenants' reservations hold: Reason is required,
	// and the ticket is an access.break_glass event as well.
	BreakGlass bool   `json:"breakGlass,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// Validate implements the input check (of both methods; each checks what it needs).
func (in OpenTunnel) Validate() error {
	if in.Node == "" && in.Reservation == "" {
		return InvalidField("node", "name the node, or a reservation that holds it")
	}
	for f, v := range map[string]string{"node": in.Node, "pool": in.Pool, "reservation": in.Reservation} {
		if v != "" {
			if err := ValidateRef(f, v); err != nil {
				return err
			}
		}
	}
	if len(in.Command) > 256 {
		return InvalidField("command", "at most 256 arguments")
	}
	total := 0
	for _, a := range in.Command {
		total += len(a)
		if err := CheckString("command", a); err != nil {
			return err
		}
	}
	if total > 64<<10 {
		return InvalidField("command", "is longer than 64 KiB")
	}
	if in.Cols < 0 || in.Cols > 10000 || in.Rows < 0 || in.Rows > 10000 {
		return InvalidField("cols", "a window is 0 to 10000 columns and rows")
	}
	if in.BreakGlass && strings.TrimSpace(in.Reason) == "" {
		return InvalidField("reason", "is required for break-glass access: say why")
	}
	if err := ValidateText("reason", in.Reason, MaxDescription); err != nil {
		return err
	}
	return ValidateText("console", in.Console, 64)
}

// TunnelTicket answers access.exec and access.console: open URL (a WebSocket, the path under
// the API's base with the ticket) within a minute, once.
type TunnelTicket struct {
	Ticket      string    `json:"ticket"`
	URL         string    `json:"url"` // BasePath+TunnelPath?ticket=…
	Node        string    `json:"node"`
	Reservation string    `json:"reservation,omitempty"`
	ExpiresAt   time.Time `json:"expiresAt"`
	// Root: the command runs as the user bcd node runs as (root on a machine it manages), for a
	// holder of the whole node or an operator. Otherwise it runs as User, the reservation's own
	// unprivileged user (ReservationUser), confined to what the reservation holds.
	Root bool   `json:"root,omitempty"`
	User string `json:"user,omitempty"`
}

// ForReplay is what an idempotent replay answers: the ticket is shown once.
func (t TunnelTicket) ForReplay() any {
	t.Ticket, t.URL = "", ""
	return t
}
