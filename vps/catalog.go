package vps

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Flavors and images: the tenant's catalog its instances are made from.

const flavorColumns = `id::text, tenant_id, name, vcpus, memory_gib, disk_gib, gpus, gpu_model, mig_profile, require_labels, created_by, created_at`

func scanFlavor(row pgx.Row) (Flavor, error) {
	var f Flavor
	err := row.Scan(&f.ID, &f.TenantID, &f.Name, &f.VCPUs, &f.MemoryGiB, &f.DiskGiB, &f.GPUs, &f.GPUModel, &f.MIGProfile, &f.RequireLabels,
		&f.CreatedBy, &f.CreatedAt)
	return f, err
}

const imageColumns = `id::text, tenant_id, name, kernel_url, kernel_sha256, initrd_url, initrd_sha256, cmdline, disk_url, disk_sha256, created_by, created_at`

func scanImage(row pgx.Row) (VMImage, error) {
	var i VMImage
	var k, ks, ir, irs, d, ds string
	if err := row.Scan(&i.ID, &i.TenantID, &i.Name, &k, &ks, &ir, &irs, &i.Cmdline, &d, &ds, &i.CreatedBy, &i.CreatedAt); err != nil {
		return i, err
	}
	i.Kernel, i.Initrd, i.Disk = artifact(k, ks), artifact(ir, irs), artifact(d, ds)
	return i, nil
}

func artifact(url, sum string) *Artifact {
	if url == "" {
		return nil
	}
	return &Artifact{URL: url, SHA256: sum}
}

func (a *Artifact) columns() (string, string) {
	if a == nil {
		return "", ""
	}
	return a.URL, a.SHA256
}

// lookupRef finds a row of table by id or, in tenant, by name: the target of a call on it.
func lookupRef(kind, table string) func(ctx context.Context, l modules.Lookup, tenantID, ref string) (modules.Target, error) {
	return lookupLive(kind, table, "")
}

// lookupRetired is lookupRef for a table whose rows are retired (deleted_at) rather than deleted:
// a retired one is not found.
func lookupRetired(kind, table string) func(ctx context.Context, l modules.Lookup, tenantID, ref string) (modules.Target, error) {
	return lookupLive(kind, table, " AND deleted_at IS NULL")
}

func lookupLive(kind, table, live string) func(ctx context.Context, l modules.Lookup, tenantID, ref string) (modules.Target, error) {
	return func(ctx context.Context, l modules.Lookup, tenantID, ref string) (modules.Target, error) {
		t := modules.Target{Existing: true, Kind: kind, Ref: ref}
		tenant := modules.TenantTarget(l.Principal, tenantID).TenantID
		err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.`+table+` WHERE (id::text = $1 OR (tenant_id = $2 AND name = $1))`+live+`
			ORDER BY (id::text = $1) DESC LIMIT 1`, ref, tenant).Scan(&t.ResourceID, &t.TenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return t, api.NotFound(kind, ref)
		}
		return t, err
	}
}

var (
	flavorTarget = lookupRetired("flavor", "vps_flavors")
	imageTarget  = lookupRetired("image", "vps_images")
)

// flavorOf finds a flavor of the tenant by id or name.
func flavorOf(ctx context.Context, q postgres.Querier, tenant, ref string) (Flavor, error) {
	f, err := scanFlavor(q.QueryRow(ctx, `SELECT `+flavorColumns+` FROM compute.vps_flavors WHERE tenant_id = $1 AND (id::text = $2 OR name = $2) AND deleted_at IS NULL
		ORDER BY (id::text = $2) DESC LIMIT 1 FOR SHARE`, tenant, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return f, api.NotFound("flavor", ref)
	}
	return f, err
}

// imageOf finds an image of the tenant by id or name.
func imageOf(ctx context.Context, q postgres.Querier, tenant, ref string) (VMImage, error) {
	i, err := scanImage(q.QueryRow(ctx, `SELECT `+imageColumns+` FROM compute.vps_images WHERE tenant_id = $1 AND (id::text = $2 OR name = $2) AND deleted_at IS NULL
		ORDER BY (id::text = $2) DESC LIMIT 1 FOR SHARE`, tenant, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return i, api.NotFound("image", ref)
	}
	return i, err
}

// pageByName lists rows of the tenant in name order; of a table that retires its rows
// (deleted_at), the live ones.
func pageByName[T any](ctx context.Context, q postgres.Querier, kind, columns, table string, retiring bool, tenant, cursor string, limit int, scan func(pgx.Row) (T, error), name func(T) string) (api.Page[T], error) {
	after := ""
	if cursor != "" {
		key, err := api.DecodeCursor(kind, cursor)
		if err != nil {
			return api.Page[T]{}, err
		}
		after = key
	}
	live := ""
	if retiring {
		live = " AND deleted_at IS NULL"
	}
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM compute.`+table+` WHERE tenant_id = $1 AND name > $2`+live+` ORDER BY name LIMIT $3`, tenant, after, limit+1)
	if err != nil {
		return api.Page[T]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
	if err != nil {
		return api.Page[T]{}, err
	}
	return api.PageOf(items, limit, kind, name), nil
}

// inUse refuses to delete what a live instance uses. It locks the row first: an instance being
// created holds it FOR SHARE (flavorOf, imageOf), so neither misses the other.
func inUse(ctx context.Context, q postgres.Querier, table, column, id, what string) error {
	if _, err := q.Exec(ctx, `SELECT 1 FROM compute.`+table+` WHERE id = $1 FOR UPDATE`, id); err != nil {
		return err
	}
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM compute.vps_instances WHERE `+column+` = $1 AND deleted_at IS NULL`, id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return api.Errorf(api.CodeFailedPrecondition, "%s is used by %d live instance(s): delete them first", what, n).With("reason", "in_use")
	}
	return nil
}

func (m *Module) registerFlavors(r *modules.Registry) {
	modules.Handle(r, FlavorsCreate, nil, func(ctx context.Context, c *modules.Call, in CreateFlavor) (Flavor, error) {
		labels := in.RequireLabels
		if labels == nil {
			labels = map[string]string{}
		}
		f, err := scanFlavor(c.Tx.QueryRow(ctx, `INSERT INTO compute.vps_flavors (id, tenant_id, name, vcpus, memory_gib, disk_gib, gpus, gpu_model, mig_profile, require_labels, created_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (tenant_id, name) WHERE deleted_at IS NULL DO NOTHING RETURNING `+flavorColumns,
			uuid.Must(uuid.NewV7()).String(), c.Target.TenantID, in.Name, in.VCPUs, in.MemoryGiB, in.DiskGiB, in.GPUs, in.GPUModel, in.MIGProfile, labels, c.Principal.ID))
		if errors.Is(err, pgx.ErrNoRows) {
			return f, api.Errorf(api.CodeConflict, "the tenant has a flavor named %q", in.Name).With("reason", "name_taken")
		}
		return f, err
	})
	modules.Handle(r, FlavorsList, nil, func(ctx context.Context, c *modules.Call, in ListFlavors) (api.Page[Flavor], error) {
		return pageByName(ctx, c.Tx, "vf1", flavorColumns, "vps_flavors", true, c.Target.TenantID, in.Cursor, in.PageLimit(), scanFlavor, func(f Flavor) string { return f.Name })
	})
	modules.Handle(r, FlavorsDelete, func(ctx context.Context, l modules.Lookup, in FlavorRef) (modules.Target, error) {
		return flavorTarget(ctx, l, in.TenantID, in.Flavor)
	}, func(ctx context.Context, c *modules.Call, in FlavorRef) (Flavor, error) {
		if err := inUse(ctx, c.Tx, "vps_flavors", "flavor_id", c.Target.ResourceID, fmt.Sprintf("flavor %s", in.Flavor)); err != nil {
			return Flavor{}, err
		}
		// Deleted instances keep their flavor's row for the record: it is marked, and its name is free.
		return scanFlavor(c.Tx.QueryRow(ctx, `UPDATE compute.vps_flavors SET deleted_at = compute.compute_now() WHERE id = $1 RETURNING `+flavorColumns, c.Target.ResourceID))
	})
}

func (m *Module) registerImages(r *modules.Registry) {
	modules.Handle(r, VMImagesRegister, nil, func(ctx context.Context, c *modules.Call, in RegisterVMImage) (VMImage, error) {
		// A VM host fetches these for the tenant: each URL's host is checked by the outbound
		// policy here. The host agent's own fetch does not check its connections yet.
		for _, f := range []struct {
			name string
			a    *Artifact
		}{{"kernel.url", in.Kernel}, {"initrd.url", in.Initrd}, {"disk.url", in.Disk}} {
			if f.a == nil {
				continue
			}
			if err := c.Runtime.Outbound.CheckURL(f.a.URL); err != nil {
				return VMImage{}, api.InvalidField(f.name, "%v: images are fetched from public addresses (an operator may allow a range: Options.Outbound.Allow)", err).
					With("reason", "refused_by_outbound_policy")
			}
		}
		k, ks := in.Kernel.columns()
		ir, irs := in.Initrd.columns()
		d, ds := in.Disk.columns()
		i, err := scanImage(c.Tx.QueryRow(ctx, `INSERT INTO compute.vps_images (id, tenant_id, name, kernel_url, kernel_sha256, initrd_url, initrd_sha256, cmdline, disk_url, disk_sha256, created_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (tenant_id, name) WHERE deleted_at IS NULL DO NOTHING RETURNING `+imageColumns,
			uuid.Must(uuid.NewV7()).String(), c.Target.TenantID, in.Name, k, ks, ir, irs, in.Cmdline, d, ds, c.Principal.ID))
		if errors.Is(err, pgx.ErrNoRows) {
			return i, api.Errorf(api.CodeConflict, "the tenant has a VM image named %q", in.Name).With("reason", "name_taken")
		}
		return i, err
	})
	modules.Handle(r, VMImagesList, nil, func(ctx context.Context, c *modules.Call, in ListVMImages) (api.Page[VMImage], error) {
		return pageByName(ctx, c.Tx, "vi1", imageColumns, "vps_images", true, c.Target.TenantID, in.Cursor, in.PageLimit(), scanImage, func(i VMImage) string { return i.Name })
	})
	modules.Handle(r, VMImagesDelete, func(ctx context.Context, l modules.Lookup, in VMImageRef) (modules.Target, error) {
		return imageTarget(ctx, l, in.TenantID, in.Image)
	}, func(ctx context.Context, c *modules.Call, in VMImageRef) (VMImage, error) {
		if err := inUse(ctx, c.Tx, "vps_images", "image_id", c.Target.ResourceID, fmt.Sprintf("image %s", in.Image)); err != nil {
			return VMImage{}, err
		}
		return scanImage(c.Tx.QueryRow(ctx, `UPDATE compute.vps_images SET deleted_at = compute.compute_now() WHERE id = $1 RETURNING `+imageColumns, c.Target.ResourceID))
	})
}
