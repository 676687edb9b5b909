// Package hetzner is the Hetzner Cloud provider of the vps module's provider pools, through
// the official client (github.com/hetznercloud/hcloud-go/v2). A server it creates carries the
// label managed-by=better-compute beside the module's own labels (the instance's id), and List
// lists only servers with that label; SSH keys are found in the project by fingerprint, or added
// to it, since Hetzner takes keys by id.
package hetzner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/provider"
)

// Name is the provider's name in the API.
const Name = "hetzner"

// The label on every server and SSH key this provider creates: List lists only these.
const (
	ManagedLabel = "managed-by"
	ManagedValue = "better-compute"
)

// DefaultTimeout bounds one request to the API.
const DefaultTimeout = 30 * time.Second

// Provider drives Hetzner Cloud's API (https://docs.hetzner.cloud). The zero value works.
type Provider struct {
	// HTTPClient, if set, sends the requests (its Timeout applies) in place of the account's
	// outbound policy's client, so its owner answers for where they go; default the policy's
	// client with DefaultTimeout.
	HTTPClient *http.Client
}

// New returns the provider with its defaults.
func New() *Provider { return &Provider{} }

var _ provider.Provider = (*Provider)(nil)

// Name implements provider.Provider.
func (*Provider) Name() string { return Name }

func (p *Provider) client(a provider.Account) (*hcloud.Client, error) {
	if a.Token == "" || strings.ContainsAny(a.Token, "\r\n\t ") {
		return nil, fmt.Errorf("hetzner: the token is empty or holds white space: %w", provider.ErrUnauthorized)
	}
	hc := p.HTTPClient
	if hc == nil {
		hc = a.Outbound.Client(DefaultTimeout)
	}
	opts := []hcloud.ClientOption{hcloud.WithToken(a.Token), hcloud.WithHTTPClient(hc), hcloud.WithApplication("better-compute", ""),
		// The module's jobs retry with their own backoff: retries in here would multiply them.
		hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0})}
	if a.Endpoint != "" {
		opts = append(opts, hcloud.WithEndpoint(a.Endpoint))
	}
	return hcloud.NewClient(opts...), nil
}

// mapErr maps Hetzner's error codes (https://docs.hetzner.cloud/reference/cloud#errors) onto
// the contract's errors. Hetzner's message is kept when the account talks to Hetzner's own API;
// an endpoint the tenant chose may be any service, so its answer is summarised (remote), as is
// every error without an answer (it may name the resolver's address).
func mapErr(a provider.Account, what string, err error) error {
	var he hcloud.Error
	if a.Endpoint != "" || !errors.As(err, &he) { // a network error may name the resolver's address
		err = remote(err)
	}
	var sentinel error
	switch {
	case hcloud.IsError(err, hcloud.ErrorCodeUnauthorized, hcloud.ErrorCodeForbidden):
		sentinel = provider.ErrUnauthorized // forbidden: a read-only token
	case hcloud.IsError(err, hcloud.ErrorCodeUniquenessError):
		sentinel = provider.ErrExists
	case hcloud.IsError(err, hcloud.ErrorCodeInvalidInput, hcloud.ErrorCodeJSONError, hcloud.ErrorCodeNotFound,
		hcloud.ErrorCodeInvalidServerType, hcloud.ErrorCodeResourceLimitExceeded, hcloud.ErrorCodeProtected):
		sentinel = provider.ErrInvalid
	default:
		return fmt.Errorf("hetzner: %s: %w", what, err) // a 5xx, a network error, a lock: worth a retry
	}
	return fmt.Errorf("hetzner: %s: %w: %w", what, sentinel, err)
}

// errorCode is what an error code of Hetzner's looks like; anything else is not repeated.
var errorCode = regexp.MustCompile(`^[a-z_]{1,40}$`)

// remote is err with its text a summary: the status and Hetzner's error code, never the message.
func remote(err error) error {
	var he hcloud.Error
	if !errors.As(err, &he) {
		return netpolicy.Opaque("", err)
	}
	summary := "the API answered"
	if r := he.Response(); r != nil && r.Response != nil {
		summary += " HTTP " + strconv.Itoa(r.StatusCode)
	}
	if errorCode.MatchString(string(he.Code)) {
		summary += " (" + string(he.Code) + ")"
	}
	return netpolicy.Opaque(summary, err)
}

// Check implements provider.Provider: one page of one server is the cheapest read that needs a
// valid token.
func (p *Provider) Check(ctx context.Context, a provider.Account) error {
	c, err := p.client(a)
	if err != nil {
		return err
	}
	_, _, err = c.Server.List(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{PerPage: 1, LabelSelector: ManagedLabel + "=" + ManagedValue}})
	if err != nil {
		return mapErr(a, "check the token", err)
	}
	return nil
}

// Create implements provider.Provider: POST /servers, started at once.
func (p *Provider) Create(ctx context.Context, a provider.Account, s provider.Spec) (provider.Server, error) {
	if s.Name == "" || s.Type == "" || s.Image == "" {
		return provider.Server{}, fmt.Errorf("hetzner: a server needs a name, a server type and an image: %w", provider.ErrInvalid)
	}
	c, err := p.client(a)
	if err != nil {
		return provider.Server{}, err
	}
	keys, err := p.sshKeys(ctx, a, c, s.SSHKeys)
	if err != nil {
		return provider.Server{}, err
	}
	labels := map[string]string{ManagedLabel: ManagedValue}
	for k, v := range s.Labels {
		labels[k] = v
	}
	start := true
	opts := hcloud.ServerCreateOpts{Name: s.Name, ServerType: &hcloud.ServerType{Name: s.Type}, Image: image(s.Image),
		SSHKeys: keys, UserData: s.UserData, Labels: labels, StartAfterCreate: &start}
	if s.Location != "" {
		opts.Location = &hcloud.Location{Name: s.Location}
	}
	res, _, err := c.Server.Create(ctx, opts)
	if err != nil {
		return provider.Server{}, mapErr(a, "create server "+s.Name, err)
	}
	return server(res.Server), nil
}

// image names an image by id when it is all digits, else by name (ubuntu-24.04).
func image(ref string) *hcloud.Image {
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		return &hcloud.Image{ID: id}
	}
	return &hcloud.Image{Name: ref}
}

// sshKeys finds each public key in the project by its fingerprint, or adds it.
func (p *Provider) sshKeys(ctx context.Context, a provider.Account, c *hcloud.Client, keys []string) ([]*hcloud.SSHKey, error) {
	var out []*hcloud.SSHKey
	for _, k := range keys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, fmt.Errorf("hetzner: SSH key %.40q: %w: %w", k, provider.ErrInvalid, err)
		}
		fp := ssh.FingerprintLegacyMD5(pub) // Hetzner's fingerprints are MD5
		key, _, err := c.SSHKey.GetByFingerprint(ctx, fp)
		if err != nil {
			return nil, mapErr(a, "find SSH key "+fp, err)
		}
		if key == nil {
			sum := sha256.Sum256(pub.Marshal())
			key, _, err = c.SSHKey.Create(ctx, hcloud.SSHKeyCreateOpts{Name: "bc-" + hex.EncodeToString(sum[:8]),
				PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))), Labels: map[string]string{ManagedLabel: ManagedValue}})
			if hcloud.IsError(err, hcloud.ErrorCodeUniquenessError) {
				key, _, err = c.SSHKey.GetByFingerprint(ctx, fp) // added meanwhile, by another server's creation
			}
			if err != nil {
				return nil, mapErr(a, "add SSH key "+fp, err)
			}
			if key == nil {
				return nil, fmt.Errorf("hetzner: SSH key %s was neither found nor added", fp)
			}
		}
		out = append(out, key)
	}
	return out, nil
}

func serverID(id string) (int64, error) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("hetzner: %q is not a server id: %w", id, provider.ErrInvalid)
	}
	return n, nil
}

// Delete implements provider.Provider: DELETE /servers/{id}; a server not found is gone already.
func (p *Provider) Delete(ctx context.Context, a provider.Account, id string) error {
	n, err := serverID(id)
	if err != nil {
		return err
	}
	c, err := p.client(a)
	if err != nil {
		return err
	}
	if _, _, err := c.Server.DeleteWithResult(ctx, &hcloud.Server{ID: n}); err != nil && !hcloud.IsError(err, hcloud.ErrorCodeNotFound) {
		return mapErr(a, "delete server "+id, err)
	}
	return nil
}

// Reinstall implements provider.Provider: Hetzner's rebuild keeps the server's id and addresses.
func (p *Provider) Reinstall(ctx context.Context, a provider.Account, id, img string) error {
	n, err := serverID(id)
	if err != nil {
		return err
	}
	if img == "" {
		return fmt.Errorf("hetzner: rebuild needs an image: %w", provider.ErrInvalid)
	}
	c, err := p.client(a)
	if err != nil {
		return err
	}
	if _, _, err := c.Server.RebuildWithResult(ctx, &hcloud.Server{ID: n}, hcloud.ServerRebuildOpts{Image: image(img)}); err != nil {
		return mapErr(a, "rebuild server "+id, err)
	}
	return nil
}

// List implements provider.Provider: the servers labelled managed-by=better-compute whose names
// start with prefix, every page.
func (p *Provider) List(ctx context.Context, a provider.Account, prefix string) ([]provider.Server, error) {
	c, err := p.client(a)
	if err != nil {
		return nil, err
	}
	all, err := c.Server.AllWithOpts(ctx, hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: ManagedLabel + "=" + ManagedValue}})
	if err != nil {
		return nil, mapErr(a, "list servers", err)
	}
	var out []provider.Server
	for _, s := range all {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, server(s))
		}
	}
	return out, nil
}

func server(s *hcloud.Server) provider.Server {
	out := provider.Server{ID: strconv.FormatInt(s.ID, 10), Name: s.Name, Status: status(s.Status), Created: s.Created}
	if ip := s.PublicNet.IPv4.IP; ip != nil && !s.PublicNet.IPv4.IsUnspecified() {
		out.IPv4 = ip.String()
	}
	if ip := s.PublicNet.IPv6.IP; ip != nil && !s.PublicNet.IPv6.IsUnspecified() {
		out.IPv6 = firstHost(ip)
	}
	return out
}

// firstHost is the ::1 of a server's /64, the address Hetzner configures on it.
func firstHost(network net.IP) string {
	ip := network.To16()
	if ip == nil {
		return ""
	}
	host := make(net.IP, len(ip))
	copy(host, ip)
	host[15] |= 1
	return host.String()
}

func status(s hcloud.ServerStatus) string {
	switch s {
	case hcloud.ServerStatusInitializing, hcloud.ServerStatusStarting, hcloud.ServerStatusRebuilding:
		return provider.StatusCreating
	case hcloud.ServerStatusRunning:
		return provider.StatusRunning
	case hcloud.ServerStatusOff, hcloud.ServerStatusStopping:
		return provider.StatusStopped
	}
	return provider.StatusOther
}
