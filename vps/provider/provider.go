// Package provider is the contract between the vps module and the cloud providers whose servers
// make up a provider pool (Hetzner Cloud in vps/provider/hetzner, Proxmox VE in
// vps/provider/proxmox). The module keeps what should exist; a provider creates, deletes,
// reinstalls and lists servers at the provider's API with an account's credentials, and the
// module's reconciler compares the list with what it expects, so that a server deleted at the
// provider is noticed.
package provider

import (
	"context"
	"errors"
	"time"

	"github.com/better-compute/compute/netpolicy"
)

// Account is what reaches a provider: its API's base URL (empty: the provider's public one) and a
// token, opened from the module's sealed copy only for the call. Options are provider-specific
// settings (Proxmox: node, storage, bridge; Hetzner: none).
//
// The tenant chose Endpoint, so a provider connects to it only through Outbound (its Client or
// Transport: no proxy, no redirect to a refused address, every connection's address checked),
// and the errors it returns never carry what the endpoint answered (a body, a message) in
// their text: they wrap it in a netpolicy.OpaqueError, whose text is a summary (the status), so
// that the module may show them to the tenant. netpolicy.Detail gives the whole, for the
// operator's log.
type Account struct {
	Endpoint string
	Token    string
	Options  map[string]string
	// Outbound is the control plane's outbound policy (modules.Runtime.Outbound); nil is the
	// default policy, public addresses only.
	Outbound *netpolicy.Policy
}

// Spec is a server to create.
type Spec struct {
	Name      string // unique at the provider within the account, e.g. bc-<instance id>
	Type      string // the provider's server type or size (Hetzner cx22; Proxmox: see Options)
	VCPUs     int    // where the provider sizes by numbers (Proxmox)
	MemoryMiB int
	DiskGiB   int
	Image     string // the provider's image name or id
	Location  string // the provider's location, zone or node
	SSHKeys   []string
	UserData  string // cloud-init
	Labels    map[string]string
}

// Server is a server as the provider reports it.
type Server struct {
	ID      string // the provider's id
	Name    string
	Status  string // StatusRunning, StatusStopped, StatusCreating, StatusOther
	IPv4    string
	IPv6    string
	Created time.Time
}

// Server statuses, the provider's own mapped onto these.
const (
	StatusCreating = "creating"
	StatusRunning  = "running"
	StatusStopped  = "stopped"
	StatusOther    = "other"
)

// Provider drives one provider's API.
type Provider interface {
	// Name is the provider's name in the API: hetzner, proxmox.
	Name() string
	// Check verifies an account (its token and options) with a cheap read, before the module
	// stores it.
	Check(ctx context.Context, a Account) error
	// Create creates a server and returns it once the provider has accepted it (it may still be
	// creating). Creating a name that exists returns ErrExists.
	Create(ctx context.Context, a Account, s Spec) (Server, error)
	// Delete deletes a server by the provider's id; one already gone is not an error.
	Delete(ctx context.Context, a Account, id string) error
	// Reinstall puts image on a server anew, keeping its id and addresses.
	Reinstall(ctx context.Context, a Account, id, image string) error
	// List returns the servers of the account whose names start with prefix.
	List(ctx context.Context, a Account, prefix string) ([]Server, error)
}

// Errors a provider returns, wrapped with its summary of the provider's answer.
var (
	ErrExists       = errors.New("provider: a server of that name exists")
	ErrUnauthorized = errors.New("provider: the token was refused")
	ErrInvalid      = errors.New("provider: the provider refused the request")
)
