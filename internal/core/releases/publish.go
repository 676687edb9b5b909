package releases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/theupdateframework/go-tuf/v2/metadata"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// publish takes the successor of the current targets metadata, signed offline, once every build
// it lists has been uploaded, and signs a snapshot and a timestamp over it.
func publish(ctx context.Context, c *modules.Call, in api.PublishTargets) (api.Published, error) {
	if err := rootOnly(c); err != nil {
		return api.Published{}, err
	}
	if err := lock(ctx, c.Tx); err != nil {
		return api.Published{}, err
	}
	cur, ok, err := latest(ctx, c.Tx, api.RoleRoot)
	if err != nil {
		return api.Published{}, err
	}
	if !ok {
		return api.Published{}, api.Errorf(api.CodeFailedPrecondition, "the release repository has no root: install one first (better-compute releases init)").With("reason", "no_root")
	}
	root, err := metadata.Root().FromBytes(cur.Body)
	if err != nil {
		return api.Published{}, fmt.Errorf("releases: the stored root: %w", err)
	}
	prev, _, err := latest(ctx, c.Tx, api.RoleTargets)
	if err != nil {
		return api.Published{}, err
	}
	at, err := now(ctx, c.Tx)
	if err != nil {
		return api.Published{}, err
	}
	t, err := tufrepo.CheckTargets(root, prev.Version, in.Targets, at)
	if err != nil {
		return api.Published{}, api.InvalidField("targets", "%v", err)
	}
	names := slices.Sorted(maps.Keys(t.Signed.Targets))
	for _, name := range names {
		tf := t.Signed.Targets[name]
		sum, _ := tufrepo.SHA256(tf)
		var length int64
		err := c.Tx.QueryRow(ctx, `SELECT length FROM compute.release_blobs WHERE sha256 = $1`, sum).Scan(&length)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && length != tf.Length) {
			return api.Published{}, api.Errorf(api.CodeFailedPrecondition, "target %s (%d bytes, sha256 %s) has not been uploaded: upload it first (releases.upload)", name, tf.Length, sum).
				With("reason", "not_uploaded").With("target", name)
		}
		if err != nil {
			return api.Published{}, err
		}
	}
	v := t.Signed.Version
	if err := insertMetadata(ctx, c.Tx, api.RoleTargets, v, in.Targets, t.Signed.Expires, c.Principal.ID); err != nil {
		return api.Published{}, err
	}
	added, err := listBuilds(ctx, c.Tx, t, c.Principal.ID)
	if err != nil {
		return api.Published{}, err
	}
	snap, ts, err := resign(ctx, c.Tx, c.Runtime.Secret, false)
	if err != nil {
		return api.Published{}, err
	}
	out := api.Published{Targets: v, Snapshot: snap, Timestamp: ts, Added: []api.Release{}}
	for _, version := range added {
		r, err := getRelease(ctx, c.Tx, version)
		if err != nil {
			return out, err
		}
		out.Added = append(out.Added, r)
		if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventPublished, TenantID: c.Target.TenantID, Subject: version,
			Data: map[string]any{"targetsVersion": v, "builds": r.Builds}}); err != nil {
			return out, err
		}
	}
	return out, nil
}

// listBuilds makes the releases and builds tables say what targets t lists, and returns the
// versions it added.
func listBuilds(ctx context.Context, tx pgx.Tx, t *metadata.Metadata[metadata.TargetsType], by string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT version FROM compute.releases`)
	if err != nil {
		return nil, err
	}
	had, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM compute.release_builds`); err != nil {
		return nil, err
	}
	var added []string
	seen := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(t.Signed.Targets)) {
		tf := t.Signed.Targets[name]
		b, _ := tufrepo.BuildOf(name, tf)
		sum, _ := tufrepo.SHA256(tf)
		if !seen[b.Version] {
			seen[b.Version] = true
			if !slices.Contains(had, b.Version) {
				added = append(added, b.Version)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO compute.releases (version, targets_version, published_by) VALUES ($1, $2, $3)
				ON CONFLICT (version) DO NOTHING`, b.Version, t.Signed.Version, by); err != nil {
				return nil, err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO compute.release_builds (target, version, os, arch, sha256, length) VALUES ($1, $2, $3, $4, $5, $6)`,
			name, b.Version, b.OS, b.Arch, sum, tf.Length); err != nil {
			return nil, err
		}
	}
	// A release the targets no longer list is no longer published.
	if _, err := tx.Exec(ctx, `DELETE FROM compute.releases r WHERE NOT EXISTS (SELECT 1 FROM compute.release_builds b WHERE b.version = r.version)`); err != nil {
		return nil, err
	}
	return added, nil
}

// resign signs a new snapshot when the targets moved, when force is set, or when the current one
// has passed half of its life, and a new timestamp whenever the snapshot is new or the current
// timestamp has passed half of its life. It returns the versions served after it. The caller
// holds the repository's lock. With no targets yet there is nothing to sign.
func resign(ctx context.Context, tx pgx.Tx, secret string, force bool) (snapshot, timestamp int64, err error) {
	targets, ok, err := latest(ctx, tx, api.RoleTargets)
	if err != nil || !ok {
		return 0, 0, err
	}
	sKey, tKey, err := keysOf(secret)
	if err != nil {
		return 0, 0, err
	}
	at, err := now(ctx, tx)
	if err != nil {
		return 0, 0, err
	}
	snap, hasSnap, err := latest(ctx, tx, api.RoleSnapshot)
	if err != nil {
		return 0, 0, err
	}
	ts, hasTS, err := latest(ctx, tx, api.RoleTimestamp)
	if err != nil {
		return 0, 0, err
	}
	listed := int64(0)
	if hasSnap {
		if s, err := metadata.Snapshot().FromBytes(snap.Body); err == nil && s.Signed.Meta[tufrepo.Targets+".json"] != nil {
			listed = s.Signed.Meta[tufrepo.Targets+".json"].Version
		}
	}
	newSnap := force || !hasSnap || listed != targets.Version || halfSpent(snap.Expires, at, tufrepo.DefaultSnapshotLifetime)
	if newSnap {
		exp := at.Add(tufrepo.DefaultSnapshotLifetime).UTC().Truncate(time.Second)
		body, err := tufrepo.NewSnapshot(snap.Version+1, targets.Version, exp, sKey)
		if err != nil {
			return 0, 0, err
		}
		snap = stored{Version: snap.Version + 1, Body: body, Expires: exp}
		if err := insertMetadata(ctx, tx, api.RoleSnapshot, snap.Version, body, exp, ""); err != nil {
			return 0, 0, err
		}
	}
	if newSnap || !hasTS || halfSpent(ts.Expires, at, tufrepo.DefaultTimestampLifetime) {
		exp := at.Add(tufrepo.DefaultTimestampLifetime).UTC().Truncate(time.Second)
		body, err := tufrepo.NewTimestamp(ts.Version+1, snap.Body, snap.Version, exp, tKey)
		if err != nil {
			return 0, 0, err
		}
		ts = stored{Version: ts.Version + 1, Body: body, Expires: exp}
		if err := insertMetadata(ctx, tx, api.RoleTimestamp, ts.Version, body, exp, ""); err != nil {
			return 0, 0, err
		}
		// Nodes fetch only the newest timestamp; the older ones are kept a while for inspection.
		if _, err := tx.Exec(ctx, `DELETE FROM compute.release_metadata WHERE role = 'timestamp' AND version < $1`, ts.Version-100); err != nil {
			return 0, 0, err
		}
	}
	return snap.Version, ts.Version, nil
}

// halfSpent: metadata of lifetime expiring at exp has less than half of it left at now.
func halfSpent(exp, now time.Time, lifetime time.Duration) bool {
	return exp.Sub(now) < lifetime/2
}

// refresh is the worker that keeps the snapshot and the timestamp fresh.
func refresh(ctx context.Context, rt *modules.Runtime) error {
	return modules.Every(ctx, RefreshEvery, func() error { return Refresh(ctx, rt.DB, rt.Secret) })
}

// Refresh signs the snapshot and the timestamp again where half of their life has passed.
func Refresh(ctx context.Context, db *postgres.DB, secret string) error {
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := lock(ctx, tx); err != nil {
			return err
		}
		_, _, err := resign(ctx, tx, secret, false)
		return err
	})
}

const releaseColumns = `r.version, r.targets_version, r.published_by, r.published_at,
	coalesce((SELECT jsonb_agg(jsonb_build_object('os', b.os, 'arch', b.arch, 'target', b.target, 'length', b.length, 'sha256', b.sha256) ORDER BY b.os, b.arch)
	          FROM compute.release_builds b WHERE b.version = r.version), '[]')`

func scanRelease(row pgx.Row) (api.Release, error) {
	var r api.Release
	var builds []byte
	if err := row.Scan(&r.Version, &r.TargetsVersion, &r.PublishedBy, &r.PublishedAt, &builds); err != nil {
		return r, err
	}
	return r, json.Unmarshal(builds, &r.Builds)
}

func getRelease(ctx context.Context, q postgres.Querier, version string) (api.Release, error) {
	r, err := scanRelease(q.QueryRow(ctx, `SELECT `+releaseColumns+` FROM compute.releases r WHERE r.version = $1`, version))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, api.NotFound("release", version)
	}
	return r, err
}

// Get returns a published release, or a not_found error.
func Get(ctx context.Context, q postgres.Querier, version string) (api.Release, error) {
	return getRelease(ctx, q, version)
}

func get(ctx context.Context, c *modules.Call, in api.GetRelease) (api.Release, error) {
	return getRelease(ctx, c.Tx, in.Version)
}

const cursorKind = "rl1"

func list(ctx context.Context, c *modules.Call, in api.ListReleases) (api.Page[api.Release], error) {
	afterTV, afterV := int64(-1), ""
	if in.Cursor != "" {
		key, err := api.DecodeCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.Release]{}, err
		}
		tv, v, ok := strings.Cut(key, "/")
		n, perr := strconv.ParseInt(tv, 10, 64)
		if !ok || perr != nil {
			return api.Page[api.Release]{}, api.InvalidField("cursor", "is not a cursor returned by this API")
		}
		afterTV, afterV = n, v
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+releaseColumns+` FROM compute.releases r
		WHERE $1::bigint < 0 OR (r.targets_version, r.version) < ($1, $2) ORDER BY r.targets_version DESC, r.version DESC LIMIT $3`, afterTV, afterV, limit+1)
	if err != nil {
		return api.Page[api.Release]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Release, error) { return scanRelease(r) })
	if err != nil {
		return api.Page[api.Release]{}, err
	}
	return api.PageOf(items, limit, cursorKind, func(r api.Release) string {
		return strconv.FormatInt(r.TargetsVersion, 10) + "/" + r.Version
	}), nil
}
