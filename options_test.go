package compute_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres/pgtest"
)

func validOptions(t *testing.T) compute.Options {
	t.Helper()
	db := pgtest.New(t) // empty: New must not need, or touch, the schema
	port, err := iam.Embedded(db, iam.EmbeddedOptions{RootTenantID: "root"})
	if err != nil {
		t.Fatal(err)
	}
	return compute.Options{Database: db, Secret: strings.Repeat("s", 32), BaseURL: "https://compute.example.com",
		RootTenantID: "root", IAM: port}
}

func TestNewOptionErrors(t *testing.T) {
	t.Parallel()
	base := validOptions(t)
	cases := []struct {
		name  string
		edit  func(*compute.Options)
		field string
	}{
		{"no database", func(o *compute.Options) { o.Database = nil }, "Database"},
		{"short secret", func(o *compute.Options) { o.Secret = strings.Repeat("s", 31) }, "Secret"},
		{"no base URL", func(o *compute.Options) { o.BaseURL = "" }, "BaseURL"},
		{"relative base URL", func(o *compute.Options) { o.BaseURL = "/api" }, "BaseURL"},
		{"ftp base URL", func(o *compute.Options) { o.BaseURL = "ftp://example.com" }, "BaseURL"},
		{"no root tenant", func(o *compute.Options) { o.RootTenantID = "" }, "RootTenantID"},
		{"no IAM", func(o *compute.Options) { o.IAM = nil }, "IAM"},
		{"nil module", func(o *compute.Options) { o.Modules = []compute.Module{nil} }, "Modules"},
		{"bad mode", func(o *compute.Options) { o.Mode = "everything" }, "Mode"},
		{"negative body limit", func(o *compute.Options) { o.MaxBodyBytes = -1 }, "MaxBodyBytes"},
		{"console API path", func(o *compute.Options) { o.Console.APIPath = "api" }, "Console.APIPath"},
		{"outbound range with host bits", func(o *compute.Options) { o.Outbound.Allow = []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")} }, "Outbound.Allow"},
		{"outbound range unset", func(o *compute.Options) { o.Outbound.Allow = []netip.Prefix{{}} }, "Outbound.Allow"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			c, err := compute.New(o)
			var oe *compute.OptionError
			if !errors.As(err, &oe) {
				t.Fatalf("New = %v, %v; want an *OptionError", c, err)
			}
			if oe.Field != tc.field || !strings.Contains(err.Error(), "Options."+tc.field) {
				t.Fatalf("error %q names field %q, want %q", err, oe.Field, tc.field)
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		c, err := compute.New(base)
		if err != nil {
			t.Fatal(err)
		}
		if c.Mode() != compute.ModeAll {
			t.Fatalf("zero Mode = %q, want the default %q", c.Mode(), compute.ModeAll)
		}
	})
}

// testModule registers whatever its register function says.
type testModule struct {
	name     string
	register func(r *modules.Registry) error
}

func (m testModule) Name() string                       { return m.name }
func (m testModule) Register(r *modules.Registry) error { return m.register(r) }

type probeIn struct{}
type probeOut struct{}

var probeMethod = api.NewMethod[probeIn, probeOut]("probes", "run", true, "compute-probe", "test", "A probe.")

func probeModule(name string, withCatalog bool) testModule {
	return testModule{name: name, register: func(r *modules.Registry) error {
		if withCatalog {
			r.ResourceTypes(iam.ResourceType{Name: "compute-probe"})
			r.Actions(modules.ActionsFor(probeMethod.Info())...)
		}
		modules.Handle(r, probeMethod, nil, func(context.Context, *modules.Call, probeIn) (probeOut, error) { return probeOut{}, nil })
		return nil
	}}
}

func TestNewRegistryErrors(t *testing.T) {
	t.Parallel()
	base := validOptions(t)
	cases := []struct {
		name    string
		modules []compute.Module
		want    string
	}{
		{"two modules claim one method", []compute.Module{probeModule("a", true), testModule{"b", func(r *modules.Registry) error {
			modules.Handle(r, probeMethod, nil, func(context.Context, *modules.Call, probeIn) (probeOut, error) { return probeOut{}, nil })
			return nil
		}}}, `method probes.run is already claimed by module "a"`},
		{"action not in the catalog", []compute.Module{probeModule("a", false)}, "uses IAM action compute:probes:run, which is not in the catalog"},
		{"module registered twice", []compute.Module{probeModule("a", true), probeModule("a", true)}, `module "a" is registered twice`},
		{"module claims a core method", []compute.Module{testModule{"c", func(r *modules.Registry) error {
			modules.Handle(r, api.PoolsCreate, nil, func(context.Context, *modules.Call, api.CreatePool) (api.Pool, error) { return api.Pool{}, nil })
			return nil
		}}}, `method pools.create is already claimed by module "fleet"`},
		{"module's Register fails", []compute.Module{testModule{"d", func(*modules.Registry) error { return errors.New("no licence") }}}, "no licence"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.Modules = tc.modules
			_, err := compute.New(o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("a module with its catalog", func(t *testing.T) {
		o := base
		o.Modules = []compute.Module{probeModule("a", true)}
		c, err := compute.New(o)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range c.Methods() {
			found = found || m.FullName() == "probes.run"
		}
		if !found {
			t.Fatal("the module's method is not in the method table")
		}
	})
}

func TestNewStartsNothing(t *testing.T) {
	t.Parallel()
	o := validOptions(t)
	c, err := compute.New(o)
	if err != nil {
		t.Fatal(err)
	}
	// Before Initialize, calls answer unavailable and nothing has been migrated.
	if _, err := c.API.Pools.List(context.Background(), "x", api.ListPools{}); api.CodeOf(err) != api.CodeUnavailable {
		t.Fatalf("a call before Initialize = %v, want unavailable", err)
	}
	if err := c.Start(context.Background()); err == nil {
		t.Fatal("Start before Initialize succeeded")
	}
	var tables int
	if err := o.Database.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_tables WHERE schemaname IN ('compute', 'iam')").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("New created %d tables; it must not touch the database", tables)
	}
}
