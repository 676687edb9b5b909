package metal

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const imageColumns = `id::text, tenant_id, name, url, format, size_bytes, sha256, kernel_url, initrd_url, cmdline, pull_token IS NOT NULL, created_by, created_at`

func scanImage(row pgx.Row) (Image, error) {
	var i Image
	err := row.Scan(&i.ID, &i.TenantID, &i.Name, &i.URL, &i.Format, &i.SizeBytes, &i.SHA256, &i.KernelURL, &i.InitrdURL, &i.Cmdline, &i.PullTokenSet, &i.CreatedBy, &i.CreatedAt)
	return i, err
}

// imagePurpose binds an image's sealed pull token to it.
func imagePurpose(id string) string { return "metal-image:" + id }

// imageRef finds an image of the tenant by id or name.
func imageRef(ctx context.Context, q postgres.Querier, tenant, ref string) (Image, error) {
	i, err := scanImage(q.QueryRow(ctx, `SELECT `+imageColumns+` FROM compute.metal_images WHERE tenant_id = $1 AND (id::text = $2 OR name = $2)
		ORDER BY (id::text = $2) DESC LIMIT 1`, tenant, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return i, api.NotFound("image", ref)
	}
	return i, err
}

func (m *Module) registerImages(r *modules.Registry) {
	modules.Handle(r, ImagesRegister, nil, func(ctx context.Context, c *modules.Call, in RegisterImage) (Image, error) {
		// A site agent pulls these for the tenant: each URL's host is checked by the outbound
		// policy here. The site agent's own pull does not check its connections yet.
		for _, f := range [][2]string{{"url", in.URL}, {"kernelUrl", in.KernelURL}, {"initrdUrl", in.InitrdURL}} {
			if f[1] == "" {
				continue
			}
			if err := c.Runtime.Outbound.CheckURL(f[1]); err != nil {
				return Image{}, api.InvalidField(f[0], "%v: images are pulled from public addresses (an operator may allow a range: Options.Outbound.Allow)", err).
					With("reason", "refused_by_outbound_policy")
			}
		}
		id := uuid.Must(uuid.NewV7()).String()
		var sealed []byte
		if in.PullToken != "" {
			var err error
			if sealed, err = c.Runtime.Secrets.Seal(imagePurpose(id), []byte(in.PullToken)); err != nil {
				return Image{}, err
			}
		}
		i, err := scanImage(c.Tx.QueryRow(ctx, `INSERT INTO compute.metal_images (id, tenant_id, name, url, format, size_bytes, sha256, kernel_url, initrd_url, cmdline, pull_token, created_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (tenant_id, name) DO NOTHING RETURNING `+imageColumns,
			id, c.Target.TenantID, in.Name, in.URL, in.Format, in.SizeBytes, in.SHA256, in.KernelURL, in.InitrdURL, in.Cmdline, sealed, c.Principal.ID))
		if errors.Is(err, pgx.ErrNoRows) {
			return i, api.Errorf(api.CodeConflict, "the tenant has an image named %q", in.Name).With("reason", "name_taken")
		}
		return i, err
	})
	modules.Handle(r, ImagesList, nil, func(ctx context.Context, c *modules.Call, in ListImages) (api.Page[Image], error) {
		after := ""
		if in.Cursor != "" {
			key, err := api.DecodeCursor("mi1", in.Cursor)
			if err != nil {
				return api.Page[Image]{}, err
			}
			after = key
		}
		limit := in.PageLimit()
		rows, err := c.Tx.Query(ctx, `SELECT `+imageColumns+` FROM compute.metal_images WHERE tenant_id = $1 AND name > $2 ORDER BY name LIMIT $3`,
			c.Target.TenantID, after, limit+1)
		if err != nil {
			return api.Page[Image]{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Image, error) { return scanImage(r) })
		if err != nil {
			return api.Page[Image]{}, err
		}
		return api.PageOf(items, limit, "mi1", func(i Image) string { return i.Name }), nil
	})
	modules.Handle(r, ImagesDelete, func(ctx context.Context, l modules.Lookup, in ImageRef) (modules.Target, error) {
		t := modules.Target{Existing: true, Kind: "image", Ref: in.Image}
		tenant := modules.TenantTarget(l.Principal, in.TenantID).TenantID
		err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.metal_images WHERE id::text = $1 OR (tenant_id = $2 AND name = $1)
			ORDER BY (id::text = $1) DESC LIMIT 1`, in.Image, tenant).Scan(&t.ResourceID, &t.TenantID)
		if errors.Is(err, pgx.ErrNoRows) {
			return t, api.NotFound("image", in.Image)
		}
		return t, err
	}, func(ctx context.Context, c *modules.Call, _ ImageRef) (Image, error) {
		return scanImage(c.Tx.QueryRow(ctx, `DELETE FROM compute.metal_images WHERE id = $1 RETURNING `+imageColumns, c.Target.ResourceID))
	})
}
