// Package releases is bcd's signed release repository on the control plane: The Update
// Framework's metadata (root and targets signed offline by their keys' holders, snapshot and
// timestamp signed here with online keys derived from the secret), the builds' bytes, the
// releases API (releases.*), the upload of builds, and the repository served to nodes over
// their mutual TLS, where bcd verifies everything with go-tuf's updater before it installs a
// build (docs/releases.md).
package releases

import (
	"context"
	"crypto/ed25519"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the release repository's schema.
var Migrations = postgres.EmbeddedMigrations("releases", "compute", migrationsFS)

// The events of the repository; their tenant is the root tenant.
const (
	EventRoot      = "release.root"      // subject: "root"
	EventPublished = "release.published" // subject: the release's version
)

// RefreshEvery is how often the worker looks whether the snapshot or the timestamp needs
// signing again: each is signed anew once half of its life has passed.
const RefreshEvery = time.Minute

// Module is the release repository.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "releases" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceRelease, Description: "bcd's signed release repository: its metadata and builds."})
	r.Actions(modules.ActionsFor(api.ReleaseMethods()...)...)
	r.EventTypes(
		modules.EventType{Name: EventRoot, Description: "The release repository's root metadata was installed or rotated (data: version, expires)."},
		modules.EventType{Name: EventPublished, Description: "A release of bcd was published: a targets version listing its builds (data: targetsVersion, builds)."},
	)
	r.Worker(modules.Worker{Name: "releases-refresh", Modes: []string{"worker"}, Run: refresh})
	modules.Handle(r, api.ReleasesKeys, nil, onlineKeys)
	modules.Handle(r, api.ReleasesSetRoot, nil, setRoot)
	modules.Handle(r, api.ReleasesUpload, nil, upload)
	modules.Handle(r, api.ReleasesPublish, nil, publish)
	modules.Handle(r, api.ReleasesGet, nil, get)
	modules.Handle(r, api.ReleasesList, nil, list)
	modules.Handle(r, api.ReleasesMetadata, nil, currentMetadata)
	return nil
}

// rootOnly refuses a change to the repository from outside the root tenant: every node of every
// tenant installs what it lists.
func rootOnly(c *modules.Call) error {
	if len(c.Target.TenantPath) == 1 && c.Target.TenantPath[0] == c.Target.TenantID {
		return nil
	}
	return api.Errorf(api.CodePermissionDenied, "the release repository serves every tenant's nodes: only callers in the root tenant may change it").
		With("reason", "root_tenant_only")
}

// lock serializes the changes to the repository: each version of each role follows the one
// before it.
func lock(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('compute.release_repository'))`)
	return err
}

// keysOf returns the online keys of a control plane's secret.
func keysOf(secret string) (snapshot, timestamp ed25519.PrivateKey, err error) {
	snapshot, timestamp, err = tufrepo.OnlineKeys(secret)
	if err != nil {
		return nil, nil, fmt.Errorf("releases: the online keys: %w", err)
	}
	return snapshot, timestamp, nil
}

func onlineKeys(_ context.Context, c *modules.Call, _ api.GetReleaseKeys) (api.ReleaseKeys, error) {
	s, t, err := keysOf(c.Runtime.Secret)
	if err != nil {
		return api.ReleaseKeys{}, err
	}
	key := func(k ed25519.PrivateKey) (api.ReleaseKey, error) {
		pub := k.Public().(ed25519.PublicKey)
		id, err := tufrepo.KeyID(pub)
		return api.ReleaseKey{KeyID: id, Type: "ed25519", Public: hex.EncodeToString(pub)}, err
	}
	var out api.ReleaseKeys
	if out.Snapshot, err = key(s); err != nil {
		return out, err
	}
	out.Timestamp, err = key(t)
	return out, err
}

// stored is one version of a role's metadata.
type stored struct {
	Version int64
	Body    []byte
	Expires time.Time
}

// latest reads the newest version of role, or ok false when there is none.
func latest(ctx context.Context, q postgres.Querier, role string) (s stored, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT version, body, expires_at FROM compute.release_metadata WHERE role = $1 ORDER BY version DESC LIMIT 1`, role).
		Scan(&s.Version, &s.Body, &s.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, err
}

func insertMetadata(ctx context.Context, tx pgx.Tx, role string, version int64, body []byte, expires time.Time, by string) error {
	_, err := tx.Exec(ctx, `INSERT INTO compute.release_metadata (role, version, body, expires_at, created_by) VALUES ($1, $2, $3, $4, $5)`,
		role, version, body, expires, by)
	return err
}

func now(ctx context.Context, q postgres.Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&t)
	return t, err
}

// setRoot installs a root: the first, or the successor of the current one. Snapshot and
// timestamp are signed again under it, so that a node that takes the new root finds metadata its
// keys signed.
func setRoot(ctx context.Context, c *modules.Call, in api.SetReleaseRoot) (api.ReleaseMetadata, error) {
	if err := rootOnly(c); err != nil {
		return api.ReleaseMetadata{}, err
	}
	if err := lock(ctx, c.Tx); err != nil {
		return api.ReleaseMetadata{}, err
	}
	s, t, err := keysOf(c.Runtime.Secret)
	if err != nil {
		return api.ReleaseMetadata{}, err
	}
	cur, ok, err := latest(ctx, c.Tx, api.RoleRoot)
	if err != nil {
		return api.ReleaseMetadata{}, err
	}
	var prev []byte
	if ok {
		prev = cur.Body
	}
	at, err := now(ctx, c.Tx)
	if err != nil {
		return api.ReleaseMetadata{}, err
	}
	root, err := tufrepo.CheckRoot(prev, in.Root, s.Public().(ed25519.PublicKey), t.Public().(ed25519.PublicKey), at)
	if err != nil {
		return api.ReleaseMetadata{}, api.InvalidField("root", "%v", err)
	}
	v, exp := root.Signed.Version, root.Signed.Expires
	if err := insertMetadata(ctx, c.Tx, api.RoleRoot, v, in.Root, exp, c.Principal.ID); err != nil {
		return api.ReleaseMetadata{}, err
	}
	if _, _, err := resign(ctx, c.Tx, c.Runtime.Secret, true); err != nil {
		return api.ReleaseMetadata{}, err
	}
	if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventRoot, TenantID: c.Target.TenantID, Subject: "root",
		Data: map[string]any{"version": v, "expires": exp.UTC().Format(time.RFC3339)}}); err != nil {
		return api.ReleaseMetadata{}, err
	}
	return api.ReleaseMetadata{Role: api.RoleRoot, Version: v, ExpiresAt: exp.UTC(), Metadata: in.Root}, nil
}

func currentMetadata(ctx context.Context, c *modules.Call, in api.GetReleaseMetadata) (api.ReleaseMetadata, error) {
	s, ok, err := latest(ctx, c.Tx, in.Role)
	if err != nil {
		return api.ReleaseMetadata{}, err
	}
	if !ok {
		return api.ReleaseMetadata{}, api.Errorf(api.CodeNotFound, "the release repository has no %s metadata yet (better-compute releases init installs a root; releases sign publishes targets)", in.Role).
			With("reason", "no_metadata")
	}
	return api.ReleaseMetadata{Role: in.Role, Version: s.Version, ExpiresAt: s.Expires.UTC(), Metadata: s.Body}, nil
}
