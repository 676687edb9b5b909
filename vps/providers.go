package vps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
	"github.com/better-compute/compute/vps/provider"
	"github.com/better-compute/compute/vps/provider/hetzner"
	"github.com/better-compute/compute/vps/provider/proxmox"
)

// Provider pools: the methods' handlers. An instance at a provider books no capacity here (the
// provider's is not ours to count): an account's maxInstances is its limit.

// EventProviderServerUnknown says a reconciliation found a server with this control plane's
// mark (its name's prefix and the provider's label or tag) that matches no instance; the
// subject is the account.
const EventProviderServerUnknown = "provider.server_unknown"

// Defaults of the provider pools' options.
const (
	DefaultProviderReconcileEvery = time.Minute
	// ProviderCheckTimeout bounds the provider's check of an account's token, inside the call.
	ProviderCheckTimeout = 20 * time.Second
)

// DriverKindProvider is the kind of provision.Driver a cloud provider is: vps registers each of
// Options.Providers as one, another module may register its own (its Value a provider.Provider),
// and an account's kind names one, found in the registry wherever an account is used.
const DriverKindProvider = "provider"

// ErrNoProvider is ProviderDriver's error for a name no module registered.
var ErrNoProvider = errors.New("vps: no such provider")

// ProviderDriver finds a registered provider.
func ProviderDriver(reg *modules.Registry, name string) (provider.Provider, error) {
	d, ok := reg.LookupDriver(DriverKindProvider, name)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not registered (%s)", ErrNoProvider, name, strings.Join(reg.DriverNames(DriverKindProvider), ", "))
	}
	p, ok := d.Value.(provider.Provider)
	if !ok {
		return nil, fmt.Errorf("vps: the provider %q is a %T, not a provider.Provider", name, d.Value)
	}
	return p, nil
}

// ServerPrefix begins the name of every server this control plane makes: bc-<instance id>.
const ServerPrefix = "bc-"

// LabelInstance is the label (Hetzner) or description line (Proxmox) that carries the
// instance's id on its server.
const LabelInstance = "better-compute/instance"

func serverName(instanceID string) string { return ServerPrefix + instanceID }

// setUpProviders fills the provider options' defaults and indexes the providers by name.
func (m *Module) setUpProviders() error {
	if m.opts.ProviderReconcileEvery <= 0 {
		m.opts.ProviderReconcileEvery = DefaultProviderReconcileEvery
	}
	ps := m.opts.Providers
	if ps == nil {
		ps = []provider.Provider{hetzner.New(), proxmox.New()}
	}
	m.providers = map[string]provider.Provider{}
	for _, p := range ps {
		if p == nil || p.Name() == "" {
			return errors.New("vps: Options.Providers holds a nil provider or one without a name")
		}
		if m.providers[p.Name()] != nil {
			return fmt.Errorf("vps: Options.Providers names provider %q twice", p.Name())
		}
		m.providers[p.Name()] = p
	}
	return nil
}

// registerProviders registers provider pools: their resource type, actions, event, methods,
// job queue and reconciler.
func (m *Module) registerProviders(r *modules.Registry) {
	for _, name := range slices.Sorted(maps.Keys(m.providers)) {
		r.Driver(provision.Driver{Kind: DriverKindProvider, Name: name, Value: m.providers[name]})
	}
	r.ResourceTypes(iam.ResourceType{Name: ResourceProviderAccount, Description: "An account at a cloud provider whose servers are instances of a provider pool."})
	r.Actions(modules.ActionsFor(ProviderMethods()...)...)
	r.EventTypes(modules.EventType{Name: EventProviderServerUnknown,
		Description: "A provider account lists a server with this control plane's mark that matches no instance (data: account, server, name)."})
	modules.Handle(r, ProviderAccountsCreate, nil, m.createAccount)
	modules.Handle(r, ProviderAccountsList, nil, func(ctx context.Context, c *modules.Call, in ListProviderAccounts) (api.Page[ProviderAccount], error) {
		return pageByName(ctx, c.Tx, "vpa1", accountColumns, "vps_provider_accounts", false, c.Target.TenantID, in.Cursor, in.PageLimit(), scanAccount,
			func(a ProviderAccount) string { return a.Name })
	})
	modules.Handle(r, ProviderAccountsDelete, func(ctx context.Context, l modules.Lookup, in ProviderAccountRef) (modules.Target, error) {
		return accountTarget(ctx, l, in.TenantID, in.Account)
	}, deleteAccount)
	modules.Handle(r, ProviderInstancesCreate, nil, m.createProviderInstance)
	modules.Handle(r, ProviderInstancesGet, providerInstanceTarget, func(ctx context.Context, c *modules.Call, _ ProviderInstanceRef) (ProviderInstance, error) {
		return getProviderInstance(ctx, c.Tx, c.Target.ResourceID, false)
	})
	modules.Handle(r, ProviderInstancesList, nil, listProviderInstances)
	modules.Handle(r, ProviderInstancesDelete, providerInstanceTarget, deleteProviderInstance)
	modules.Handle(r, ProviderInstancesReinstall, func(ctx context.Context, l modules.Lookup, in ReinstallProviderInstance) (modules.Target, error) {
		return providerInstanceTarget(ctx, l, ProviderInstanceRef{TenantID: in.TenantID, Instance: in.Instance})
	}, reinstallProviderInstance)
	m.registerProviderWork(r)
}

// Accounts.

const accountColumns = `id::text, tenant_id, name, kind, endpoint, options, flavors, location, max_instances, unknown_servers,
	reconciled_at, reconcile_error, created_by, created_at`

func scanAccount(row pgx.Row) (ProviderAccount, error) {
	var a ProviderAccount
	err := row.Scan(&a.ID, &a.TenantID, &a.Name, &a.Kind, &a.Endpoint, &a.Options, &a.Flavors, &a.Location, &a.MaxInstances, &a.UnknownServers,
		&a.ReconciledAt, &a.ReconcileError, &a.CreatedBy, &a.CreatedAt)
	a.TokenSet = err == nil // a row always holds one
	return a, err
}

var accountTarget = lookupRef("provider account", "vps_provider_accounts")

func tokenPurpose(accountID string) string { return "vps-provider-token:" + accountID }

func userDataPurpose(instanceID string) string { return "vps-provider-userdata:" + instanceID }

// createAccount checks the token with the provider, inside the call (the caller hears at once
// that it is refused), and stores it sealed.
func (m *Module) createAccount(ctx context.Context, c *modules.Call, in CreateProviderAccount) (ProviderAccount, error) {
	p, err := ProviderDriver(c.Runtime.Registry, in.Kind)
	if errors.Is(err, ErrNoProvider) {
		return ProviderAccount{}, api.InvalidField("kind", "%q is not a provider of this control plane (%s)",
			in.Kind, strings.Join(c.Runtime.Registry.DriverNames(DriverKindProvider), ", "))
	}
	if err != nil {
		return ProviderAccount{}, err
	}
	options := in.Options
	if options == nil {
		options = map[string]string{}
	}
	// The endpoint is the tenant's choice: checked by the outbound policy here, and each
	// connection to it by the policy's dialer.
	if in.Endpoint != "" {
		if err := c.Runtime.Outbound.CheckURL(in.Endpoint); err != nil {
			return ProviderAccount{}, api.InvalidField("endpoint", "%v: a provider's API is reached at a public address (an operator may allow a range: Options.Outbound.Allow)", err).
				With("reason", "refused_by_outbound_policy")
		}
	}
	check, cancel := context.WithTimeout(ctx, ProviderCheckTimeout)
	defer cancel()
	if err := p.Check(check, provider.Account{Endpoint: in.Endpoint, Token: in.Token, Options: options, Outbound: c.Runtime.Outbound}); err != nil {
		c.Runtime.Logger.InfoContext(ctx, "vps: a provider refused an account's check", "kind", in.Kind, "endpoint", in.Endpoint, "error", netpolicy.Detail(err))
		return ProviderAccount{}, providerRefusal(in.Kind, err)
	}
	id := uuid.Must(uuid.NewV7()).String()
	sealed, err := c.Runtime.Secrets.Seal(tokenPurpose(id), []byte(in.Token))
	if err != nil {
		return ProviderAccount{}, err
	}
	flavors := in.Flavors
	if flavors == nil {
		flavors = map[string]string{}
	}
	a, err := scanAccount(c.Tx.QueryRow(ctx, `INSERT INTO compute.vps_provider_accounts (id, tenant_id, name, kind, endpoint, token, options, flavors, location, max_instances, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (tenant_id, name) DO NOTHING RETURNING `+accountColumns,
		id, c.Target.TenantID, in.Name, in.Kind, in.Endpoint, sealed, options, flavors, in.Location, in.MaxInstances, c.Principal.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, api.Errorf(api.CodeConflict, "the tenant has a provider account named %q", in.Name).With("reason", "name_taken")
	}
	return a, err
}

// providerRefusal is the API's error for a provider's answer to an account's check: the token
// refused, the account's settings refused, the endpoint's address refused by the outbound
// policy, or the provider out of reach. err's text is the provider's summary, never what the
// endpoint answered (provider.Account).
func providerRefusal(kind string, err error) error {
	var refused *netpolicy.RefusedError
	switch {
	case errors.As(err, &refused):
		return api.InvalidField("endpoint", "%s: a provider's API is reached at a public address (an operator may allow a range: Options.Outbound.Allow)",
			netpolicy.Describe(err)).With("reason", "refused_by_outbound_policy")
	case errors.Is(err, provider.ErrUnauthorized):
		return api.InvalidField("token", "the %s API refused the token: %v", kind, err).With("reason", "token_refused")
	case errors.Is(err, provider.ErrInvalid):
		return api.Errorf(api.CodeInvalidArgument, "the %s API refused the account: %v", kind, err).With("reason", "account_refused")
	}
	return api.Errorf(api.CodeUnavailable, "the %s API could not be asked: %v", kind, err).With("reason", "provider_unreachable")
}

func deleteAccount(ctx context.Context, c *modules.Call, in ProviderAccountRef) (ProviderAccount, error) {
	var n int
	if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.vps_provider_instances WHERE account_id = $1 AND status <> 'deleted'`,
		c.Target.ResourceID).Scan(&n); err != nil {
		return ProviderAccount{}, err
	}
	if n > 0 {
		return ProviderAccount{}, api.Errorf(api.CodeFailedPrecondition,
			"provider account %s has %d instance(s) whose server may still exist: delete them first", in.Account, n).With("reason", "in_use")
	}
	a, err := scanAccount(c.Tx.QueryRow(ctx, `DELETE FROM compute.vps_provider_accounts WHERE id = $1 RETURNING `+accountColumns, c.Target.ResourceID))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, api.NotFound("provider account", in.Account)
	}
	return a, err
}

// Instances.

const providerInstanceColumns = `i.id::text, i.tenant_id, i.name, i.account_name, coalesce(i.account_id::text, ''), i.kind, i.flavor_name,
	i.server_type, i.image, i.location, i.ssh_keys, i.user_data IS NOT NULL, i.server_id, i.ipv4, i.ipv6, i.status, i.status_detail,
	i.status_at, i.deleted_at, i.deleted_reason, i.labels, i.created_by, i.created_at`

func scanProviderInstance(row pgx.Row) (ProviderInstance, error) {
	var i ProviderInstance
	err := row.Scan(&i.ID, &i.TenantID, &i.Name, &i.Provider, &i.ProviderID, &i.Kind, &i.Flavor, &i.ServerType, &i.Image, &i.Location,
		&i.SSHKeys, &i.UserDataSet, &i.ServerID, &i.IPv4, &i.IPv6, &i.Status, &i.StatusDetail, &i.StatusAt, &i.DeletedAt, &i.DeletedReason,
		&i.Labels, &i.CreatedBy, &i.CreatedAt)
	i.ServerName = serverName(i.ID)
	return i, err
}

func getProviderInstance(ctx context.Context, q postgres.Querier, id string, lock bool) (ProviderInstance, error) {
	sql := `SELECT ` + providerInstanceColumns + ` FROM compute.vps_provider_instances i WHERE i.id = $1`
	if lock {
		sql += ` FOR UPDATE`
	}
	i, err := scanProviderInstance(q.QueryRow(ctx, sql, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return i, api.NotFound("provider instance", id)
	}
	return i, err
}

// providerInstanceTarget finds a provider instance by id, or by name among the tenant's live
// ones.
func providerInstanceTarget(ctx context.Context, l modules.Lookup, in ProviderInstanceRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "provider instance", Ref: in.Instance}
	tenant := modules.TenantTarget(l.Principal, in.TenantID).TenantID
	err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.vps_provider_instances
		WHERE id::text = $1 OR (tenant_id = $2 AND name = $1 AND deleted_at IS NULL) ORDER BY (id::text = $1) DESC LIMIT 1`, in.Instance, tenant).
		Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("provider instance", in.Instance)
	}
	return t, err
}

// createProviderInstance records the instance, pending, and enqueues the job that makes its
// server, in the call's transaction: the job exists exactly when the instance does.
func (m *Module) createProviderInstance(ctx context.Context, c *modules.Call, in CreateProviderInstance) (ProviderInstance, error) {
	acct, err := scanAccount(c.Tx.QueryRow(ctx, `SELECT `+accountColumns+` FROM compute.vps_provider_accounts
		WHERE tenant_id = $1 AND (id::text = $2 OR name = $2) ORDER BY (id::text = $2) DESC LIMIT 1 FOR UPDATE`, c.Target.TenantID, in.Provider))
	if errors.Is(err, pgx.ErrNoRows) {
		return ProviderInstance{}, api.NotFound("provider account", in.Provider)
	}
	if err != nil {
		return ProviderInstance{}, err
	}
	f, err := flavorOf(ctx, c.Tx, c.Target.TenantID, in.Flavor)
	if err != nil {
		return ProviderInstance{}, err
	}
	serverType := acct.Flavors[f.Name]
	if len(acct.Flavors) > 0 && serverType == "" {
		return ProviderInstance{}, api.InvalidField("flavor", "provider account %s maps no server type to flavor %s (it maps %s)",
			acct.Name, f.Name, strings.Join(slices.Sorted(maps.Keys(acct.Flavors)), ", ")).With("reason", "flavor_not_mapped")
	}
	if acct.MaxInstances > 0 {
		var n int
		if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.vps_provider_instances WHERE account_id = $1 AND status <> 'deleted'`,
			acct.ID).Scan(&n); err != nil {
			return ProviderInstance{}, err
		}
		if n >= acct.MaxInstances {
			return ProviderInstance{}, api.Errorf(api.CodeQuotaExceeded, "provider account %s holds %d instance(s), its limit (maxInstances)", acct.Name, n).
				With("reason", "account_full").With("limit", acct.MaxInstances)
		}
	}
	id := uuid.Must(uuid.NewV7()).String()
	var userData []byte
	if in.UserData != "" {
		if userData, err = c.Runtime.Secrets.Seal(userDataPurpose(id), []byte(in.UserData)); err != nil {
			return ProviderInstance{}, err
		}
	}
	location := in.Location
	if location == "" {
		location = acct.Location
	}
	keys, labels := in.SSHKeys, in.Labels
	if keys == nil {
		keys = []string{}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	_, err = c.Tx.Exec(ctx, `INSERT INTO compute.vps_provider_instances (id, tenant_id, name, account_id, account_name, kind, flavor_id, flavor_name,
			vcpus, memory_gib, disk_gib, server_type, image, location, ssh_keys, user_data, labels, created_by, status_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, compute.compute_now())`,
		id, c.Target.TenantID, in.Name, acct.ID, acct.Name, acct.Kind, f.ID, f.Name, f.VCPUs, f.MemoryGiB, f.DiskGiB, serverType, in.Image,
		location, keys, userData, labels, c.Principal.ID)
	if postgres.ErrorCode(err) == postgres.UniqueViolation {
		return ProviderInstance{}, api.Errorf(api.CodeConflict, "the tenant has a live provider instance named %q", in.Name).With("reason", "name_taken")
	}
	if err != nil {
		return ProviderInstance{}, err
	}
	if _, err := c.Runtime.Jobs.InsertTx(ctx, c.Tx, providerCreateArgs{Instance: id}, nil); err != nil {
		return ProviderInstance{}, err
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventInstanceCreated, TenantID: c.Target.TenantID, Subject: id,
		Data: map[string]any{"name": in.Name, "flavor": f.Name, "provider": acct.Name, "kind": acct.Kind}}); err != nil {
		return ProviderInstance{}, err
	}
	return getProviderInstance(ctx, c.Tx, id, false)
}

func listProviderInstances(ctx context.Context, c *modules.Call, in ListProviderInstances) (api.Page[ProviderInstance], error) {
	var before *string
	if in.Cursor != "" {
		key, err := api.DecodeCursor("vpi1", in.Cursor)
		if err != nil {
			return api.Page[ProviderInstance]{}, err
		}
		before = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+providerInstanceColumns+` FROM compute.vps_provider_instances i
		WHERE i.tenant_id = $1 AND ($2::text IS NULL OR i.id::text < $2)
		AND ($3 = '' OR i.account_id::text = $3 OR i.account_name = $3) AND ($4 = '' OR i.status = $4) AND ($5 OR i.deleted_at IS NULL)
		ORDER BY i.id DESC LIMIT $6`, c.Target.TenantID, before, in.Provider, in.Status, in.Deleted || in.Status == ProviderDeleted || in.Status == ProviderDeleting, limit+1)
	if err != nil {
		return api.Page[ProviderInstance]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProviderInstance, error) { return scanProviderInstance(r) })
	if err != nil {
		return api.Page[ProviderInstance]{}, err
	}
	return api.PageOf(items, limit, "vpi1", func(i ProviderInstance) string { return i.ID }), nil
}

// deleteProviderInstance records the deletion and enqueues the job that deletes the server:
// the instance is deleting until the provider confirms.
func deleteProviderInstance(ctx context.Context, c *modules.Call, _ ProviderInstanceRef) (ProviderInstance, error) {
	i, err := getProviderInstance(ctx, c.Tx, c.Target.ResourceID, true)
	if err != nil || i.DeletedAt != nil {
		return i, err // deleting a deleted instance answers it as it is
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.vps_provider_instances SET deleted_at = compute.compute_now(), deleted_reason = 'deleted',
		status = 'deleting', status_detail = '', status_at = compute.compute_now() WHERE id = $1`, i.ID); err != nil {
		return i, err
	}
	if _, err := c.Runtime.Jobs.InsertTx(ctx, c.Tx, providerDeleteArgs{Instance: i.ID}, nil); err != nil {
		return i, err
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventInstanceDeleted, TenantID: i.TenantID, Subject: i.ID,
		Data: map[string]any{"name": i.Name, "reason": "deleted", "provider": i.Provider}}); err != nil {
		return i, err
	}
	return getProviderInstance(ctx, c.Tx, i.ID, false)
}

// reinstallProviderInstance enqueues the job that puts an image on the server anew.
func reinstallProviderInstance(ctx context.Context, c *modules.Call, in ReinstallProviderInstance) (ProviderInstance, error) {
	i, err := getProviderInstance(ctx, c.Tx, c.Target.ResourceID, true)
	if err != nil {
		return i, err
	}
	switch {
	case i.DeletedAt != nil:
		return i, api.Errorf(api.CodeFailedPrecondition, "provider instance %s was deleted", i.Name).With("reason", "deleted")
	case i.ServerID == "" || i.Status == ProviderLost:
		return i, api.Errorf(api.CodeFailedPrecondition, "provider instance %s has no server at its provider (%s)", i.Name, i.Status).With("reason", "no_server")
	}
	image := in.Image
	if image == "" {
		image = i.Image
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.vps_provider_instances SET image = $2, status = 'creating', status_detail = 'reinstalling',
		status_at = compute.compute_now() WHERE id = $1`, i.ID, image); err != nil {
		return i, err
	}
	if _, err := c.Runtime.Jobs.InsertTx(ctx, c.Tx, providerReinstallArgs{Instance: i.ID, Image: image}, nil); err != nil {
		return i, err
	}
	return getProviderInstance(ctx, c.Tx, i.ID, false)
}
