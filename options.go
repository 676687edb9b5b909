package compute

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"time"

	"github.com/better-compute/compute/console"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
)

// Mode is a process mode: which parts of the control plane this process runs.
type Mode string

// The process modes. One configuration runs in any of them; ModeAll runs everything in one process.
const (
	ModeAPI     Mode = "api"     // the public API and JoinService
	ModeGateway Mode = "gateway" // daemon sessions and command dispatch
	ModeWorker  Mode = "worker"  // reconcilers, expiry, billing, event sinks
	ModeAll     Mode = "all"
)

// Module is an optional part of Better Compute (metal, vps, provision, or the host's own).
type Module = modules.Module

// Defaults for zero Options fields.
const (
	DefaultMode                  = ModeAll
	DefaultMaxBodyBytes          = envelope.DefaultMaxBodyBytes
	DefaultDecisionCacheTTL      = 2 * time.Second
	DefaultDecisionCacheMax      = 100_000
	DefaultPoolLeaseTTL          = capacity.LeaseTTLDefault
	DefaultMaxEventStreamsPerKey = 8
	// MinSecretLength is the shortest Secret accepted.
	MinSecretLength = 32
)

// Options configure a control plane. New validates them; zero values mean the defaults above.
type Options struct {
	// Database is the PostgreSQL pool that holds the truth. Required.
	Database *postgres.DB
	// Secret encrypts what Better Compute keeps secret (the machine CA's key). At least
	// MinSecretLength characters. Required.
	Secret string
	// BaseURL is the public URL of the API, e.g. https://compute.example.com. Required.
	BaseURL string
	// RootTenantID is the IAM root (platform) tenant. Required.
	RootTenantID string
	// IAM is the identity and policy port, e.g. iam.Embedded(db, …). Required.
	IAM iam.Port
	// Modules are the optional modules, registered in order after the core.
	Modules []Module
	// Mode decides what Start runs. Default ModeAll.
	Mode Mode
	// Logger receives the control plane's logs. Default slog.Default().
	Logger *slog.Logger
	// MaxBodyBytes bounds an API request body. Default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// DecisionCacheTTL is how long a read's IAM decision may be reused. Default
	// DefaultDecisionCacheTTL; negative turns the cache off. Mutations always decide afresh.
	DecisionCacheTTL time.Duration

	// GatewayAddresses (host:port) are handed to nodes when they join.
	GatewayAddresses []string
	// NodeCertLifetime is how long a node's client certificate is valid; nodes renew it over
	// their session after half of it. Default 24h.
	NodeCertLifetime time.Duration
	// HeartbeatInterval fixes the interval gateways ask of nodes. Default: spread a budget of 100
	// heartbeats a second per gateway over its sessions, between 5s and 9s.
	HeartbeatInterval time.Duration

	// Webhooks tunes the delivery of events to webhook endpoints.
	Webhooks WebhookOptions
	// Outbound is the policy of every connection the control plane makes where a tenant chose
	// (webhooks, provider accounts' endpoints, BMCs of machines with no site, image URLs):
	// public addresses only, unless Allow lists more (docs/security.md, "Outbound requests").
	Outbound OutboundOptions
	// PoolLeaseTTL is the lease time of the pool-lease placer: an api-mode process that places
	// for a pool takes its lease when no one holds it and places the pool's common requests
	// (whole GPUs now, batched) from memory, the database still the referee
	// (docs/capacity.md). A holder that dies is replaced within about this time. Default
	// DefaultPoolLeaseTTL; at least a second; negative turns the placer off.
	PoolLeaseTTL time.Duration
	// Console configures ConsoleHandler, the web console (docs/console.md): where it finds the
	// API, and whether a person signed in to the host may use it without an API key (Session).
	// The zero value signs in with API keys only.
	Console ConsoleOptions
	// MaxEventStreamsPerKey is how many event streams (GET /api/compute/events/stream) one
	// credential may hold open at once in this process; one more is refused as quota_exceeded.
	// Default DefaultMaxEventStreamsPerKey; negative: no limit.
	MaxEventStreamsPerKey int
	// JobRescueAfter is how long a durable job (a webhook attempt, a workflow step) may have been
	// running before it is taken for lost with its process and worked again elsewhere. It must
	// exceed every workflow step's Timeout (plus 5 s of bookkeeping). Default 1h.
	JobRescueAfter time.Duration

	outbound *netpolicy.Policy // Outbound's policy, made by withDefaults
}

// DefaultJobRescueAfter is Options.JobRescueAfter's default.
const DefaultJobRescueAfter = time.Hour

// WebhookOptions tune webhook delivery (docs/events.md). Zero values mean the defaults.
type WebhookOptions struct {
	// AllowPrivateTargets lets tenants' URLs and addresses be loopback, private, link-local or
	// any other address the outbound policy refuses: tests, a development server, or a host
	// whose receivers are all on its own network. It is an alias of Outbound.Allow listing
	// every range (netpolicy.AllRanges), so it applies to every outbound request, webhooks'
	// and the rest. Refused by default.
	AllowPrivateTargets bool
	// Timeout bounds one attempt. Default 10s.
	Timeout time.Duration
	// MaxResponseBytes bounds what is read of an answer's body (it is discarded). Default 64 KiB.
	MaxResponseBytes int64
	// RetryBase is the delay before the first retry; each next one doubles, ±20%, up to
	// RetryMax. Defaults 5s and 1h.
	RetryBase, RetryMax time.Duration
	// DeadAfter is how long a delivery is retried before it is dead. Default 72h.
	DeadAfter time.Duration
	// MaxEndpointsPerTenant bounds the endpoints one tenant holds: each is a delivery of every
	// event it matches, in the queue all tenants share. Default 100; negative: no limit.
	MaxEndpointsPerTenant int
}

// OutboundOptions configure the outbound policy (package netpolicy).
type OutboundOptions struct {
	// Allow are address ranges tenants may reach although the policy refuses them otherwise:
	// the network of the BMCs of machines with no site, a Proxmox cluster's, an image mirror's
	// (e.g. 10.20.0.0/16). Each is allowed as written, whatever class it falls in. None by
	// default.
	Allow []netip.Prefix
}

// policy is the outbound policy o configures: Allow, and every range when
// Webhooks.AllowPrivateTargets is set.
func (o Options) policy() (*netpolicy.Policy, error) {
	allow := o.Outbound.Allow
	if o.Webhooks.AllowPrivateTargets {
		allow = append(append([]netip.Prefix(nil), allow...), netpolicy.AllRanges...)
	}
	return netpolicy.New(allow)
}

// ConsoleOptions configure the web console. Session, when set, answers a credential the API
// accepts (a short-lived IAM token, say) for the person behind a request, from the host's own
// session, or console.ErrNoSession; the console then signs that person in without a key.
type ConsoleOptions = console.Options

// OptionError is the error of New for an invalid Options field.
type OptionError struct {
	Field   string // e.g. "Secret"
	Problem string
}

func (e *OptionError) Error() string { return "compute: Options." + e.Field + " " + e.Problem }

// withDefaults returns a copy of o with zero fields filled and every field checked.
func (o Options) withDefaults() (Options, error) {
	bad := func(field, format string, args ...any) (Options, error) {
		return o, &OptionError{Field: field, Problem: fmt.Sprintf(format, args...)}
	}
	if o.Database == nil || o.Database.Pool == nil {
		return bad("Database", "is required: open one with postgres.Open")
	}
	if len(o.Secret) < MinSecretLength {
		return bad("Secret", "must be at least %d characters, got %d", MinSecretLength, len(o.Secret))
	}
	if o.BaseURL == "" {
		return bad("BaseURL", "is required: the public URL of the API, e.g. https://compute.example.com")
	}
	u, err := url.Parse(o.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return bad("BaseURL", "%q is not an absolute http or https URL", o.BaseURL)
	}
	if o.RootTenantID == "" {
		return bad("RootTenantID", "is required: the IAM root tenant's id")
	}
	if o.IAM == nil {
		return bad("IAM", "is required: an iam.Port such as iam.Embedded(db, …)")
	}
	for i, m := range o.Modules {
		if m == nil {
			return bad("Modules", "[%d] is nil", i)
		}
	}
	switch o.Mode {
	case "":
		o.Mode = DefaultMode
	case ModeAPI, ModeGateway, ModeWorker, ModeAll:
	default:
		return bad("Mode", "%q is not a mode: use api, gateway, worker or all", o.Mode)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.JobRescueAfter == 0:
		o.JobRescueAfter = DefaultJobRescueAfter
	case o.JobRescueAfter < 0:
		return bad("JobRescueAfter", "must not be negative, got %s", o.JobRescueAfter)
	}
	// Every line logged with a call's context names its request id, a module's as the core's.
	o.Logger = slog.New(envelope.LogHandler(o.Logger.Handler()))
	switch {
	case o.MaxBodyBytes == 0:
		o.MaxBodyBytes = DefaultMaxBodyBytes
	case o.MaxBodyBytes < 0:
		return bad("MaxBodyBytes", "must not be negative, got %d", o.MaxBodyBytes)
	}
	if o.MaxEventStreamsPerKey == 0 {
		o.MaxEventStreamsPerKey = DefaultMaxEventStreamsPerKey
	}
	if o.DecisionCacheTTL == 0 {
		o.DecisionCacheTTL = DefaultDecisionCacheTTL
	}
	switch {
	case o.PoolLeaseTTL == 0:
		o.PoolLeaseTTL = DefaultPoolLeaseTTL
	case o.PoolLeaseTTL > 0 && o.PoolLeaseTTL < time.Second:
		return bad("PoolLeaseTTL", "must be at least 1s (or negative, to turn the pool-lease placer off), got %s", o.PoolLeaseTTL)
	}
	for i, a := range o.GatewayAddresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return bad("GatewayAddresses", "[%d] %q is not host:port", i, a)
		}
	}
	if o.NodeCertLifetime < 0 || o.HeartbeatInterval < 0 {
		return bad("NodeCertLifetime", "and HeartbeatInterval must not be negative")
	}
	for i, a := range o.Outbound.Allow {
		switch {
		case !a.IsValid():
			return bad("Outbound.Allow", "[%d] is not a range: write one such as 10.20.0.0/16", i)
		case a != a.Masked():
			return bad("Outbound.Allow", "[%d] %s has host bits set: write %s", i, a, a.Masked())
		}
	}
	if o.outbound, err = o.policy(); err != nil {
		return bad("Outbound.Allow", "%v", err)
	}
	o.Outbound.Allow = append([]netip.Prefix(nil), o.Outbound.Allow...)
	o.Modules = append([]Module(nil), o.Modules...)
	return o, nil
}
