package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
)

// iamCmd administers the embedded Better IAM directly on the deployment's database: the
// commands a Go host would make through iam.Local's admin API.
func iamCmd(p *profile) *cobra.Command {
	c := &cobra.Command{
		Use:   "iam",
		Short: "Administer the embedded Better IAM of a deployment (on its database)",
		Long: `iam administers the embedded Better IAM on the deployment's database (--database-url or
$BETTER_COMPUTE_DATABASE_URL): tenants, identities, API keys, roles and bindings, feature flags,
meters, delegations and confirmations. A deployment on a remote Better IAM is administered there.`,
	}
	a := &iamAdmin{p: p}
	c.PersistentFlags().StringVar(&a.dbURL, "database-url", "", "the deployment's database ($BETTER_COMPUTE_DATABASE_URL)")
	c.PersistentFlags().StringVar(&a.root, "root-tenant", "root", "the root tenant")

	c.AddCommand(a.adminKey(), a.tenants(), a.identities(), a.keys(), a.roles(), a.bind(), a.flags(), a.meters(),
		a.delegations(), a.confirmations(), a.events())
	return c
}

// Each command has variables of its own: cobra writes a flag's default into its variable when
// the flag is defined, so commands sharing one would see each other's defaults.

func (a *iamAdmin) adminKey() *cobra.Command {
	var tenant, name string
	c := a.command("admin-key", "Make an API key with every right in a tenant (the first key of a deployment)", cobra.NoArgs,
		func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
			k, err := l.CreateAdminKey(ctx, a.tenant(tenant), name)
			return k.Token, err
		})
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant the key administers (default: the root)")
	c.Flags().StringVar(&name, "name", "admin", "the service identity's name")
	return c
}

func (a *iamAdmin) tenants() *cobra.Command {
	g := group("tenant", "Tenants: the tree of organizations and projects")
	var in iam.CreateTenant
	create := a.command("create", "Create a tenant under a parent", cobra.NoArgs, func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
		in.ParentID = a.tenant(in.ParentID)
		return l.CreateTenant(ctx, in)
	})
	create.Flags().StringVar(&in.ID, "id", "", "the tenant's id (default: a new one)")
	create.Flags().StringVar(&in.ParentID, "parent", "", "the parent tenant (default: the root)")
	create.Flags().StringVar(&in.Kind, "kind", "", "organization or project (default: organization under the root, project below)")
	create.Flags().StringVar(&in.Name, "name", "", "a display name")
	del := a.command("delete TENANT", "Delete a tenant that has no child tenants, with its identities, keys and roles", cobra.ExactArgs(1),
		func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			return map[string]string{"deleted": args[0]}, l.DeleteTenant(ctx, args[0])
		})
	g.AddCommand(create, del)
	return g
}

func (a *iamAdmin) identities() *cobra.Command {
	g := group("identity", "Identities: users, services and agents")
	var tenant, kind, name string
	create := a.command("create", "Create an identity in a tenant", cobra.NoArgs, func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
		return l.CreateIdentity(ctx, a.tenant(tenant), iam.IdentityKind(kind), name)
	})
	create.Flags().StringVar(&tenant, "tenant", "", "the identity's tenant (default: the root)")
	create.Flags().StringVar(&kind, "kind", "service", "user, service or agent")
	create.Flags().StringVar(&name, "name", "", "the identity's name")
	g.AddCommand(create)
	return g
}

func (a *iamAdmin) keys() *cobra.Command {
	g := group("key", "API keys of services and agents")
	var identity, name string
	var expires time.Duration
	create := a.command("create", "Create an API key; its token is shown once", cobra.NoArgs, func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
		var until time.Time
		switch {
		case expires < 0:
			return nil, usageError{Err: fmt.Errorf("--expires %s: want a positive duration such as 720h", expires)}
		case expires > 0:
			until = time.Now().Add(expires)
		}
		return l.CreateAPIKey(ctx, identity, name, until)
	})
	create.Flags().StringVar(&identity, "identity", "", "the service or agent the key authenticates")
	create.Flags().StringVar(&name, "name", "", "a name for the key")
	create.Flags().DurationVar(&expires, "expires", 0, "how long the key lives, e.g. 720h (default: until revoked)")
	revoke := a.command("revoke KEY", "Revoke an API key: it stops authenticating at once", cobra.ExactArgs(1),
		func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			return map[string]string{"revoked": args[0]}, l.RevokeAPIKey(ctx, args[0])
		})
	g.AddCommand(create, revoke)
	return g
}

func (a *iamAdmin) roles() *cobra.Command {
	g := group("role", "Roles: policy documents")
	var tenant, name, policy string
	create := a.command("create", "Create a role from a policy document (a file, or - for standard input)", cobra.NoArgs,
		func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
			doc, err := readPolicy(policy, os.Stdin)
			if err != nil {
				return nil, err
			}
			return l.CreateRole(ctx, a.tenant(tenant), name, doc)
		})
	create.Flags().StringVar(&tenant, "tenant", "", "the role's tenant (default: the root)")
	create.Flags().StringVar(&name, "name", "", "the role's name")
	create.Flags().StringVar(&policy, "policy", "", `the policy document: {"version": 1, "statements": [...]}`)
	g.AddCommand(create)
	return g
}

func (a *iamAdmin) bind() *cobra.Command {
	var identity, role, tenant string
	c := a.command("bind", "Bind a role to an identity in a tenant (and the tenants below it)", cobra.NoArgs,
		func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
			t := a.tenant(tenant)
			return map[string]string{"identityId": identity, "roleId": role, "tenantId": t}, l.Bind(ctx, identity, role, t)
		})
	c.Flags().StringVar(&identity, "identity", "", "the identity")
	c.Flags().StringVar(&role, "role", "", "the role's id")
	c.Flags().StringVar(&tenant, "tenant", "", "where the binding applies (default: the root)")
	return c
}

func (a *iamAdmin) flags() *cobra.Command {
	g := group("flag", "Feature flags: a default and per-tenant overrides")
	var def bool
	var description string
	set := a.command("set KEY", "Create a flag or change its default", cobra.ExactArgs(1), func(ctx context.Context, l *iam.Local, args []string) (any, error) {
		return map[string]any{"key": args[0], "default": def}, l.SetFlag(ctx, args[0], def, description)
	})
	set.Flags().BoolVar(&def, "default", false, "the flag's value where no tenant overrides it")
	set.Flags().StringVar(&description, "description", "", "what the flag turns on")
	var tenant string
	var value bool
	override := a.command("override KEY", "Set a flag's value for a tenant and the tenants below it", cobra.ExactArgs(1),
		func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			t := a.tenant(tenant)
			return map[string]any{"key": args[0], "tenantId": t, "value": value}, l.OverrideFlag(ctx, args[0], t, value)
		})
	override.Flags().StringVar(&tenant, "tenant", "", "the tenant (default: the root)")
	override.Flags().BoolVar(&value, "value", false, "the value there")
	var in string
	get := a.command("get KEY", "Evaluate a flag in a tenant", cobra.ExactArgs(1), func(ctx context.Context, l *iam.Local, args []string) (any, error) {
		t := a.tenant(in)
		v, err := l.Flag(ctx, t, args[0])
		return map[string]any{"key": args[0], "tenantId": t, "value": v}, err
	})
	get.Flags().StringVar(&in, "tenant", "", "the tenant (default: the root)")
	g.AddCommand(set, override, get)
	return g
}

func (a *iamAdmin) meters() *cobra.Command {
	g := group("meter", "Billing meters")
	var m iam.Meter
	create := a.command("create KEY", "Create a meter (lowercase, dot-separated: gpu.h100.hours) where missing", cobra.ExactArgs(1),
		func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			m.Key = args[0]
			return m, l.EnsureMeters(ctx, []iam.Meter{m})
		})
	create.Flags().StringVar(&m.Unit, "unit", "", "the unit, e.g. GPU-hour")
	create.Flags().StringVar(&m.Description, "description", "", "what the meter counts")
	var tenant string
	usage := a.command("usage METER", "Total usage recorded on a meter for a tenant", cobra.ExactArgs(1),
		func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			t := a.tenant(tenant)
			total, n, err := l.UsageTotal(ctx, t, args[0])
			return map[string]any{"meter": args[0], "tenantId": t, "quantity": total, "records": n}, err
		})
	usage.Flags().StringVar(&tenant, "tenant", "", "the tenant (default: the root)")
	g.AddCommand(create, usage)
	return g
}

func (a *iamAdmin) delegations() *cobra.Command {
	g := group("delegation", "Delegations from people to agents")
	var tenant, person, agent string
	var confirm []string
	create := a.command("create", "Delegate a person's rights to an agent; --confirm lists actions that need the person's approval each time", cobra.NoArgs,
		func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
			return l.CreateDelegation(ctx, a.tenant(tenant), person, agent, confirm)
		})
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant (default: the root)")
	create.Flags().StringVar(&person, "person", "", "the user who delegates")
	create.Flags().StringVar(&agent, "agent", "", "the agent")
	create.Flags().StringSliceVar(&confirm, "confirm", nil, "action patterns that need a confirmation, e.g. compute:reservations:*")
	g.AddCommand(create)
	return g
}

func (a *iamAdmin) confirmations() *cobra.Command {
	g := group("confirmation", "Confirmations agents asked for")
	decide := func(use, short string, approve bool) *cobra.Command {
		var person string
		c := a.command(use, short, cobra.ExactArgs(1), func(ctx context.Context, l *iam.Local, args []string) (any, error) {
			if err := l.DecideConfirmation(ctx, args[0], person, approve); err != nil {
				return nil, err
			}
			return l.Confirmation(ctx, args[0])
		})
		c.Flags().StringVar(&person, "person", "", "the user deciding (the delegation's person)")
		return c
	}
	get := a.command("get ID", "Show a confirmation", cobra.ExactArgs(1), func(ctx context.Context, l *iam.Local, args []string) (any, error) {
		return l.Confirmation(ctx, args[0])
	})
	g.AddCommand(decide("approve ID", "Approve a confirmation: the agent's call then succeeds once", true),
		decide("deny ID", "Deny a confirmation", false), get)
	return g
}

func (a *iamAdmin) events() *cobra.Command {
	var after int64
	var limit int
	c := a.command("events", "List IAM's events (keys revoked, bindings created, tenants created and deleted, flags set) after a cursor", cobra.NoArgs,
		func(ctx context.Context, l *iam.Local, _ []string) (any, error) {
			evs, next, err := l.Events(ctx, after, limit)
			page := map[string]any{"items": evs}
			if len(evs) == limit {
				page["nextCursor"] = strconv.FormatInt(next, 10)
			}
			return page, err
		})
	c.Flags().Int64Var(&after, "cursor", 0, "list the events after this cursor (an event id)")
	c.Flags().IntVar(&limit, "limit", 100, "at most this many")
	return c
}

// iamAdmin opens the embedded IAM of the deployment for one command.
type iamAdmin struct {
	p           *profile
	dbURL, root string
}

func (a *iamAdmin) tenant(t string) string {
	if t == "" {
		return a.root
	}
	return t
}

func group(use, short string) *cobra.Command { return &cobra.Command{Use: use, Short: short} }

// command makes a subcommand that runs fn on the embedded IAM and prints what it returns: a
// string as it is (a token), anything else as the output format asks.
func (a *iamAdmin) command(use, short string, args cobra.PositionalArgs, fn func(context.Context, *iam.Local, []string) (any, error)) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: args, RunE: func(cmd *cobra.Command, argv []string) error {
		if a.dbURL == "" {
			a.dbURL = os.Getenv(postgres.EnvDatabaseURL)
		}
		if a.dbURL == "" {
			return usageError{Err: errors.New("iam commands need --database-url or $" + postgres.EnvDatabaseURL)}
		}
		ctx, stop := signals()
		defer stop()
		db, err := postgres.Open(ctx, a.dbURL)
		if err != nil {
			return err
		}
		defer db.Close()
		l, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: a.root})
		if err != nil {
			return err
		}
		if err := l.Initialize(ctx); err != nil {
			return err
		}
		out, err := fn(ctx, l, argv)
		if err != nil {
			return err
		}
		if s, ok := out.(string); ok && !structured(a.p.Output) {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), clean(s)) // a token: the line alone, for $(…)
			return err
		}
		raw, err := json.Marshal(out)
		if err != nil {
			return err
		}
		return render(cmd.OutOrStdout(), a.p.Output, raw)
	}}
}

// readPolicy reads and checks a policy document from a file, or from stdin for "-".
func readPolicy(path string, stdin io.Reader) (iam.Policy, error) {
	if path == "" {
		return iam.Policy{}, usageError{Err: errors.New("--policy is required: a file with the policy document, or - for standard input")}
	}
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return iam.Policy{}, fmt.Errorf("--policy: %w", err)
	}
	doc, err := iam.ParsePolicy(b)
	if err != nil {
		return iam.Policy{}, fmt.Errorf("--policy %s: %w", path, err)
	}
	return doc, nil
}
