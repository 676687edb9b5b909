package devserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/postgres/embedded"
)

// FlagSet is what the standard library's flag.FlagSet and pflag's both offer: examples/devserver
// uses one and `better-compute dev` the other, with the same names.
type FlagSet interface {
	StringVar(p *string, name, value, usage string)
	IntVar(p *int, name string, value int, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
}

// Default addresses: loopback only, as befits a server whose printed key has every right.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultGatewayListen = "127.0.0.1:8443"
)

// Deprecated maps the flags the mains had before to the ones that replace them; Flags defines
// them still, and a main says so when one is used.
var Deprecated = map[string]string{"addr": "listen", "gateway": "gateway-listen"}

// Flags defines the devserver's flags on flags, filling o and verbose. `better-compute serve` uses
// the same names for what it shares: --listen, --gateway-listen, --verbose,
// --allow-private-webhooks.
func (o *Options) Flags(flags FlagSet, verbose *bool) {
	flags.StringVar(&o.Addr, "listen", DefaultListen, "the API's address (and the JoinService's, the console's, /metrics)")
	flags.StringVar(&o.GatewayAddr, "gateway-listen", DefaultGatewayListen, "the node sessions' address (mutual TLS)")
	flags.StringVar(&o.DataDir, "data-dir", "", "keep the database, the secret and the API key here across restarts (default: a temporary database, deleted on exit)")
	flags.IntVar(&o.Sim, "sim", 0, fmt.Sprintf("join this many simulated GPU machines (%d H100s each) into the pool %q", SimGPUs, SimPool))
	flags.IntVar(&o.PostgresPort, "postgres-port", 0, "the embedded PostgreSQL's loopback port (default: a free one)")
	flags.StringVar(&o.PostgresPassword, "postgres-password", "", "the embedded PostgreSQL superuser's password (default: the one kept in --data-dir, or a new one)")
	flags.BoolVar(&o.AllowPrivateWebhooks, "allow-private-webhooks", false, "let webhooks reach loopback and private addresses, to try them with a local receiver (development only)")
	flags.BoolVar(verbose, "verbose", false, "debug logs")
	flags.StringVar(&o.Addr, "addr", DefaultListen, "deprecated: --listen")
	flags.StringVar(&o.GatewayAddr, "gateway", DefaultGatewayListen, "deprecated: --gateway-listen")
}

// ErrEmbeddedOnly is Start's error (wrapped) for a port or password chosen for the embedded
// PostgreSQL while BETTER_COMPUTE_DATABASE_URL names another server: a mistake in the command
// line, for a main.
var ErrEmbeddedOnly = fmt.Errorf("a PostgreSQL port or password is chosen for the embedded PostgreSQL, but $%s names another server: unset one or the other", postgres.EnvDatabaseURL)

// database chooses the PostgreSQL: BETTER_COMPUTE_DATABASE_URL's, or an embedded one.
func (s *Server) database(ctx context.Context, o Options) error {
	if u := os.Getenv(postgres.EnvDatabaseURL); u != "" && !o.Embedded {
		if o.PostgresPort != 0 || o.PostgresPassword != "" {
			return ErrEmbeddedOnly
		}
		s.Database, s.DatabaseFromEnv, s.stopDB = u, true, func(context.Context) error { return nil }
		return nil
	}
	sets, key, err := migrations(o)
	if err != nil {
		return err
	}
	c, err := embedded.Start(ctx, embedded.Options{DataDir: pgDir(o.DataDir), Port: o.PostgresPort, Password: o.PostgresPassword,
		Prepare: func(ctx context.Context, url string) error {
			db, err := postgres.Open(ctx, url)
			if err != nil {
				return err
			}
			defer db.Close()
			return postgres.Migrate(ctx, db, sets...)
		}, PrepareKey: key})
	if err != nil {
		return err
	}
	s.Database, s.stopDB = c.URL("postgres"), c.Stop
	return nil
}

// migrations are what the embedded PostgreSQL's template is prepared with, so that a cold start
// copies the schema rather than making it (most of a start once initdb was out of it): the
// control plane's and the modules' migration sets, then IAM's, in Initialize's order; and a key
// naming them by their files' contents. Initialize then finds them applied.
func migrations(o Options) ([]postgres.MigrationSet, string, error) {
	var mods []compute.Module
	if o.Modules != nil {
		var err error
		if mods, err = o.Modules("http://" + DefaultListen); err != nil { // their sets do not depend on the URL
			return nil, "", err
		}
	}
	sets, err := compute.MigrationSets(mods...)
	if err != nil {
		return nil, "", err
	}
	sets = append(sets, iam.Migrations)
	h := sha256.New()
	for _, set := range sets {
		fmt.Fprintf(h, "set %s %s\n", set.Name, set.Schema)
		err := fs.WalkDir(set.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(set.FS, path)
			fmt.Fprintf(h, "%s %d\n", path, len(b))
			h.Write(b)
			return err
		})
		if err != nil {
			return nil, "", fmt.Errorf("migrations %s: %w", set.Name, err)
		}
	}
	return sets, hex.EncodeToString(h.Sum(nil)), nil
}

// adminKey gives the server a key with every right in the root tenant: the one kept in dataDir
// while it authenticates, or else a new one, kept there. Without a data directory each start
// makes one, and the earlier ones stay valid until revoked.
func (s *Server) adminKey(ctx context.Context, dataDir string) error {
	path := ""
	if dataDir != "" {
		path = filepath.Join(dataDir, "api-key")
		b, err := os.ReadFile(path)
		switch {
		case err == nil:
			key := strings.TrimSpace(string(b))
			if _, err := s.IAM.Authenticate(ctx, key); err == nil {
				s.APIKey, s.APIKeyFile = key, path
				return nil
			}
			// Revoked, expired, or of another database: a new one replaces it.
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("read the API key: %w", err)
		}
	}
	key, err := s.IAM.CreateAdminKey(ctx, RootTenantID, "devserver")
	if err != nil {
		return err
	}
	s.APIKey = key.Token
	if path != "" {
		if err := os.WriteFile(path, []byte(key.Token+"\n"), 0o600); err != nil {
			return fmt.Errorf("keep the API key: %w", err)
		}
		s.APIKeyFile = path
	}
	return nil
}

// Describe prints what a user needs to reach the server: its addresses, the API key and where
// it is kept, the database, the machine CA's pin, and whether webhooks may reach private
// addresses. Each "Name: value" line holds the value alone (scripts cut it out), notes on the
// lines below it.
func (s *Server) Describe(w io.Writer) {
	const note = "            " // under the values
	fmt.Fprintf(w, "Better Compute devserver\n")
	fmt.Fprintf(w, "  URL:      %s\n  Console:  %s\n  Gateway:  %s\n", s.URL, s.Console, s.Gateway)
	fmt.Fprintf(w, "  API key:  %s\n", s.APIKey)
	switch {
	case s.APIKeyFile != "":
		fmt.Fprintf(w, note+"(kept in %s: the same after a restart)\n", s.APIKeyFile)
	case s.DatabaseFromEnv:
		fmt.Fprintf(w, note+"(new at every start, and the earlier ones stay valid: --data-dir keeps one)\n")
	}
	if s.DatabaseFromEnv {
		redacted := "(unparsable)"
		if u, err := url.Parse(s.Database); err == nil {
			redacted = u.Redacted()
		}
		fmt.Fprintf(w, "  Database: %s\n"+note+"(from $%s)\n", redacted, postgres.EnvDatabaseURL)
	} else {
		fmt.Fprintf(w, "  Database: %s\n", s.Database)
	}
	if hash, err := s.Compute.Runtime().Fleet.CAHash(); err == nil {
		fmt.Fprintf(w, "  CA hash:  %s (bcd join --ca-hash pins the machine CA)\n", hash)
	}
	if s.PrivateWebhooks {
		fmt.Fprintf(w, "  Webhooks: may reach loopback and private addresses (--allow-private-webhooks; development only)\n")
	}
}
