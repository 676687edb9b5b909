package vps

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/api"
)

// Provider pools: instances made at a cloud provider's API (Hetzner Cloud, Proxmox VE) with a
// provider account's credentials, instead of on a VM host of a pool. The methods, types and
// limits; providers.go has the handlers, providerwork.go the jobs and the reconciler.

// ResourceProviderAccount is the IAM resource type of provider accounts.
const ResourceProviderAccount = "vps-provider-account"

// The methods of provider pools. A provider instance is a vps-instance to IAM.
var (
	ProviderAccountsCreate = api.NewMethod[CreateProviderAccount, ProviderAccount]("providerAccounts", "create", true, ResourceProviderAccount, "v0.5",
		"Add an account at a provider (hetzner, proxmox): its token is checked with the provider, kept sealed and never answered.")
	ProviderAccountsList = api.NewMethod[ListProviderAccounts, api.Page[ProviderAccount]]("providerAccounts", "list", false, ResourceProviderAccount, "v0.5",
		"List provider accounts, with the servers each last listed that match no instance.")
	ProviderAccountsDelete = api.NewMethod[ProviderAccountRef, ProviderAccount]("providerAccounts", "delete", true, ResourceProviderAccount, "v0.5",
		"Remove a provider account that has no instance left at its provider.")

	ProviderInstancesCreate = api.NewMethod[CreateProviderInstance, ProviderInstance]("providerInstances", "create", true, ResourceInstance, "v0.5",
		"Create an instance at a provider with an account: a job creates the server, retrying, and the reconciler follows it.")
	ProviderInstancesGet = api.NewMethod[ProviderInstanceRef, ProviderInstance]("providerInstances", "get", false, ResourceInstance, "v0.5",
		"Get a provider instance: its server, addresses and status as its provider last reported them.")
	ProviderInstancesList = api.NewMethod[ListProviderInstances, api.Page[ProviderInstance]]("providerInstances", "list", false, ResourceInstance, "v0.5",
		"List provider instances.")
	ProviderInstancesDelete = api.NewMethod[ProviderInstanceRef, ProviderInstance]("providerInstances", "delete", true, ResourceInstance, "v0.5",
		"Delete a provider instance: a job deletes its server at the provider.")
	ProviderInstancesReinstall = api.NewMethod[ReinstallProviderInstance, ProviderInstance]("providerInstances", "reinstall", true, ResourceInstance, "v0.5",
		"Put an image on a provider instance anew (Hetzner's rebuild; a fresh clone on Proxmox VE), keeping its server and addresses.")
)

// ProviderMethods are the methods of provider pools.
func ProviderMethods() []api.MethodInfo {
	return []api.MethodInfo{ProviderAccountsCreate.Info(), ProviderAccountsList.Info(), ProviderAccountsDelete.Info(),
		ProviderInstancesCreate.Info(), ProviderInstancesGet.Info(), ProviderInstancesList.Info(), ProviderInstancesDelete.Info(),
		ProviderInstancesReinstall.Info()}
}

// Limits of provider accounts and instances.
const (
	MaxProviderToken    = 4096
	MaxProviderOptions  = 32
	MaxProviderOption   = 16 << 10 // a CA bundle fits
	MaxProviderFlavors  = 256
	MaxProviderSSHKeys  = 16
	MaxProviderUserData = 32 << 10 // Hetzner's limit
)

// ProviderAccount is an account at a provider. Its token is write-only: no answer carries it.
type ProviderAccount struct {
	ID       string `json:"id"`
	TenantID string `json:"tenantId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`               // the provider: hetzner, proxmox
	Endpoint string `json:"endpoint,omitempty"` // the API's base URL; empty: the provider's public one
	TokenSet bool   `json:"tokenSet"`
	// Options are the provider's settings (Proxmox: node, storage, pool, disk, ciuser,
	// ipconfig0, caPEM).
	Options map[string]string `json:"options"`
	// Flavors maps the tenant's flavors, by name, to the provider's server types (Hetzner:
	// {"small": "cx22"}). When it maps any, an instance's flavor must be among them.
	Flavors      map[string]string `json:"flavors"`
	Location     string            `json:"location,omitempty"`     // where instances go unless they say
	MaxInstances int               `json:"maxInstances,omitempty"` // instances it may hold at once; 0: no limit
	// UnknownServers are the servers with this control plane's mark that the last
	// reconciliation found matching no instance (provider ids).
	UnknownServers []string   `json:"unknownServers"`
	ReconciledAt   *time.Time `json:"reconciledAt,omitempty"`
	ReconcileError string     `json:"reconcileError,omitempty"`
	CreatedBy      string     `json:"createdBy"`
	CreatedAt      time.Time  `json:"createdAt"`
}

// CreateProviderAccount is the input of providerAccounts.create.
type CreateProviderAccount struct {
	TenantID     string            `json:"tenantId,omitempty"`
	Name         string            `json:"name"`
	Kind         string            `json:"kind"`
	Endpoint     string            `json:"endpoint,omitempty"`
	Token        string            `json:"token"` // write-only
	Options      map[string]string `json:"options,omitempty"`
	Flavors      map[string]string `json:"flavors,omitempty"`
	Location     string            `json:"location,omitempty"`
	MaxInstances int               `json:"maxInstances,omitempty"`
}

var optionKeyRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// Validate implements the input check. No message repeats the token.
func (in CreateProviderAccount) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if err := api.ValidateName("kind", in.Kind); err != nil {
		return err
	}
	if in.Endpoint != "" {
		u, err := url.Parse(in.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(in.Endpoint) > 2048 {
			return api.InvalidField("endpoint", "must be the provider API's http or https URL, at most 2048 bytes")
		}
	}
	switch {
	case in.Token == "":
		return api.InvalidField("token", "is required: the provider's API token")
	case len(in.Token) > MaxProviderToken:
		return api.InvalidField("token", "is %d bytes long; the limit is %d", len(in.Token), MaxProviderToken)
	case strings.IndexFunc(in.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0:
		return api.InvalidField("token", "holds white space or control characters")
	}
	if len(in.Options) > MaxProviderOptions {
		return api.InvalidField("options", "has %d entries; the limit is %d", len(in.Options), MaxProviderOptions)
	}
	for k, v := range in.Options {
		if !optionKeyRE.MatchString(k) {
			return api.InvalidField("options", "key %q is not an option name (letters and digits, 64 at most)", k)
		}
		if err := api.ValidateText("options."+k, v, MaxProviderOption); err != nil {
			return err
		}
	}
	if len(in.Flavors) > MaxProviderFlavors {
		return api.InvalidField("flavors", "has %d entries; the limit is %d", len(in.Flavors), MaxProviderFlavors)
	}
	for k, v := range in.Flavors {
		if err := api.ValidateName("flavors", k); err != nil {
			return err
		}
		if v == "" {
			return api.InvalidField("flavors."+k, "names no server type")
		}
		if err := api.ValidateText("flavors."+k, v, 128); err != nil {
			return err
		}
	}
	if in.MaxInstances < 0 || in.MaxInstances > 1_000_000 {
		return api.InvalidField("maxInstances", "must be between 0 (no limit) and 1000000")
	}
	return api.ValidateText("location", in.Location, 128)
}

// ListProviderAccounts is the input of providerAccounts.list.
type ListProviderAccounts struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// ProviderAccountRef names a provider account.
type ProviderAccountRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Account  string `json:"account"` // id or name
}

// Validate implements the input check.
func (in ProviderAccountRef) Validate() error { return api.ValidateRef("account", in.Account) }

// Statuses of a provider instance. Pending: its create job has not made the server yet;
// creating, running, stopped, other: as the provider last reported its server; error: the
// provider refused it (StatusDetail says why); lost: its server went at the provider, not by
// this control plane; deleting: deleted here, its server not yet confirmed gone; deleted.
const (
	ProviderPending  = "pending"
	ProviderCreating = "creating"
	ProviderRunning  = "running"
	ProviderStopped  = "stopped"
	ProviderOther    = "other"
	ProviderError    = "error"
	ProviderLost     = "lost"
	ProviderDeleting = "deleting"
	ProviderDeleted  = "deleted"
)

var providerStatuses = []string{ProviderPending, ProviderCreating, ProviderRunning, ProviderStopped, ProviderOther,
	ProviderError, ProviderLost, ProviderDeleting, ProviderDeleted}

// ProviderInstance is an instance at a provider.
type ProviderInstance struct {
	ID          string   `json:"id"`
	TenantID    string   `json:"tenantId"`
	Name        string   `json:"name"`
	Provider    string   `json:"provider"`   // the account's name
	ProviderID  string   `json:"providerId"` // the account's id; empty once the account is gone
	Kind        string   `json:"kind"`
	Flavor      string   `json:"flavor"`
	ServerType  string   `json:"serverType,omitempty"`
	Image       string   `json:"image"` // the provider's image (Proxmox: a template VM)
	Location    string   `json:"location,omitempty"`
	SSHKeys     []string `json:"sshKeys,omitempty"`
	UserDataSet bool     `json:"userDataSet,omitempty"` // the user data is write-only
	// ServerID is the provider's id of its server (Hetzner: a number; Proxmox: node/vmid),
	// once made; ServerName is the server's name there, bc-<id>.
	ServerID      string            `json:"serverId,omitempty"`
	ServerName    string            `json:"serverName"`
	IPv4          string            `json:"ipv4,omitempty"`
	IPv6          string            `json:"ipv6,omitempty"`
	Status        string            `json:"status"`
	StatusDetail  string            `json:"statusDetail,omitempty"`
	StatusAt      *time.Time        `json:"statusAt,omitempty"`
	DeletedAt     *time.Time        `json:"deletedAt,omitempty"`
	DeletedReason string            `json:"deletedReason,omitempty"`
	Labels        map[string]string `json:"labels"`
	CreatedBy     string            `json:"createdBy"`
	CreatedAt     time.Time         `json:"createdAt"`
}

// CreateProviderInstance is the input of providerInstances.create.
type CreateProviderInstance struct {
	TenantID string `json:"tenantId,omitempty"`
	Name     string `json:"name"`
	Provider string `json:"provider"` // the account, by id or name
	Flavor   string `json:"flavor"`
	Image    string `json:"image"`              // the provider's: ubuntu-24.04 at Hetzner, a template VM at Proxmox
	Location string `json:"location,omitempty"` // default the account's
	// SSHKeys are public keys (authorized_keys lines) let in as root, or cloud-init's user.
	SSHKeys []string `json:"sshKeys,omitempty"`
	// UserData is cloud-init's user data (Hetzner); write-only.
	UserData string            `json:"userData,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Validate implements the input check.
func (in CreateProviderInstance) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	for f, v := range map[string]string{"provider": in.Provider, "flavor": in.Flavor} {
		if err := api.ValidateRef(f, v); err != nil {
			return err
		}
	}
	if in.Image == "" {
		return api.InvalidField("image", "is required: the provider's image (Hetzner: e.g. ubuntu-24.04; Proxmox VE: a template VM's name or id)")
	}
	if err := api.ValidateText("image", in.Image, 256); err != nil {
		return err
	}
	if err := api.ValidateText("location", in.Location, 128); err != nil {
		return err
	}
	if len(in.SSHKeys) > MaxProviderSSHKeys {
		return api.InvalidField("sshKeys", "has %d keys; the limit is %d", len(in.SSHKeys), MaxProviderSSHKeys)
	}
	for i, k := range in.SSHKeys {
		if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil || len(strings.TrimSpace(string(rest))) > 0 {
			return api.InvalidField(fmt.Sprintf("sshKeys[%d]", i), "is not one public key in authorized_keys form (ssh-ed25519 AAAA… comment)")
		}
	}
	if len(in.UserData) > MaxProviderUserData {
		return api.InvalidField("userData", "is %d bytes long; the limit is %d", len(in.UserData), MaxProviderUserData)
	}
	if err := api.ValidateText("userData", in.UserData, MaxProviderUserData); err != nil {
		return err
	}
	return api.ValidateLabels("labels", in.Labels)
}

// ProviderInstanceRef names a provider instance.
type ProviderInstanceRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Instance string `json:"instance"` // id or name
}

// Validate implements the input check.
func (in ProviderInstanceRef) Validate() error { return api.ValidateRef("instance", in.Instance) }

// ReinstallProviderInstance is the input of providerInstances.reinstall.
type ReinstallProviderInstance struct {
	TenantID string `json:"tenantId,omitempty"`
	Instance string `json:"instance"`
	Image    string `json:"image,omitempty"` // default the image it has
}

// Validate implements the input check.
func (in ReinstallProviderInstance) Validate() error {
	if err := api.ValidateRef("instance", in.Instance); err != nil {
		return err
	}
	return api.ValidateText("image", in.Image, 256)
}

// ListProviderInstances is the input of providerInstances.list.
type ListProviderInstances struct {
	TenantID string `json:"tenantId,omitempty"`
	Provider string `json:"provider,omitempty"` // an account's id or name
	Status   string `json:"status,omitempty"`
	Deleted  bool   `json:"deleted,omitempty"` // list deleted instances too
	api.PageRequest
}

// Validate implements the input check.
func (in ListProviderInstances) Validate() error {
	if in.Provider != "" {
		if err := api.ValidateRef("provider", in.Provider); err != nil {
			return err
		}
	}
	if err := api.ValidateEnum("status", in.Status, providerStatuses...); err != nil {
		return err
	}
	return in.PageRequest.Validate()
}
