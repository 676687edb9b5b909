package vps

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
)

// Events of sandboxes; the subject is the sandbox.
const (
	EventSandboxCreated = "sandbox.created"
	EventSandboxDeleted = "sandbox.deleted"
	EventSandboxExpired = "sandbox.expired" // its time to live ran out: the worker deleted it
	EventSandboxStatus  = "sandbox.status"  // its host reported a new status
	EventSandboxLost    = "sandbox.lost"    // its host could not reach its runtime for Options.LostAfter
)

// warmPrincipal is who the warm pools' instances are booked by: the module itself.
var warmPrincipal = iam.Principal{ID: "vps:warm-pool", Name: "the vps module's warm pools"}

const templateColumns = `t.id::text, t.tenant_id, t.name, t.pool_id::text, f.name, m.name, t.env, t.network,
	t.ttl, t.max_ttl, t.warm, t.ready_line, t.warmup, t.created_by, t.created_at,
	(SELECT count(*) FROM compute.vps_instances w ` + warmReadySQL + `),
	(SELECT count(*) FILTER (WHERE NOT (w.power = 'paused' AND w.status = 'paused')) FROM compute.vps_instances w
		WHERE w.template_id = t.id AND w.kind = 'warm' AND w.deleted_at IS NULL)`

// warmReadySQL is the warm instances of template t a create would take now: paused, on a host
// that is online and reaches its runtime (one that does not could not resume it). The template's
// warmReady counts them with it, so that it says what createSandbox finds.
const warmReadySQL = `JOIN compute.vps_hosts h ON h.node_id = w.node_id JOIN compute.nodes n ON n.id = w.node_id
	WHERE w.template_id = t.id AND w.kind = 'warm' AND w.deleted_at IS NULL AND w.power = 'paused' AND w.status = 'paused'
	  AND h.unreachable = '' AND n.status = 'online'`

const templateFrom = ` FROM compute.vps_sandbox_templates t JOIN compute.vps_flavors f ON f.id = t.flavor_id JOIN compute.vps_images m ON m.id = t.image_id`

func scanTemplate(row pgx.Row) (SandboxTemplate, error) {
	var t SandboxTemplate
	var ttl, maxTTL, warmup time.Duration
	err := row.Scan(&t.ID, &t.TenantID, &t.Name, &t.PoolID, &t.Flavor, &t.Image, &t.Env, &t.Network, &ttl, &maxTTL, &t.Warm, &t.ReadyLine, &warmup,
		&t.CreatedBy, &t.CreatedAt, &t.WarmReady, &t.WarmBooting)
	t.TTL, t.MaxTTL, t.Warmup = ttl.String(), maxTTL.String(), warmup.String()
	return t, err
}

const sandboxColumns = instanceColumns + `, t.name, t.id::text, i.expires_at, i.from_warm_pool`

const sandboxFrom = instanceFrom + ` JOIN compute.vps_sandbox_templates t ON t.id = i.template_id`

func scanSandbox(row pgx.Row) (Sandbox, error) {
	var s Sandbox
	i := &s.Instance
	err := row.Scan(&i.ID, &i.TenantID, &i.Name, &i.Flavor, &i.FlavorID, &i.Image, &i.ImageID, &i.ReservationID, &i.NodeID,
		&i.Power, &i.Status, &i.StatusDetail, &i.StatusAt, &i.DeletedAt, &i.DeletedReason, &i.Labels, &i.CreatedBy, &i.CreatedAt, &i.kind,
		&s.Template, &s.TemplateID, &s.ExpiresAt, &s.FromWarmPool)
	return s, err
}

func getSandbox(ctx context.Context, q postgres.Querier, id string) (Sandbox, error) {
	s, err := scanSandbox(q.QueryRow(ctx, `SELECT `+sandboxColumns+sandboxFrom+` WHERE i.id = $1 AND i.kind = 'sandbox'`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return s, api.NotFound("sandbox", id)
	}
	if err != nil {
		return s, err
	}
	nics, err := instanceNICs(ctx, q, []string{s.ID})
	s.NICs = nics[s.ID]
	return s, err
}

func sandboxTarget(ctx context.Context, l modules.Lookup, in SandboxRef) (modules.Target, error) {
	return kindTarget(ctx, l, kindSandbox, in.TenantID, in.Sandbox)
}

func (m *Module) registerSandboxes(r *modules.Registry) {
	templateTarget := func(ctx context.Context, l modules.Lookup, in SandboxTemplateRef) (modules.Target, error) {
		return lookupRetired("template", "vps_sandbox_templates")(ctx, l, in.TenantID, in.Template)
	}
	modules.Handle(r, SandboxTemplatesCreate, nil, createTemplate)
	modules.Handle(r, SandboxTemplatesGet, templateTarget, func(ctx context.Context, c *modules.Call, _ SandboxTemplateRef) (SandboxTemplate, error) {
		return scanTemplate(c.Tx.QueryRow(ctx, `SELECT `+templateColumns+templateFrom+` WHERE t.id = $1`, c.Target.ResourceID))
	})
	modules.Handle(r, SandboxTemplatesList, nil, func(ctx context.Context, c *modules.Call, in ListSandboxTemplates) (api.Page[SandboxTemplate], error) {
		after := ""
		if in.Cursor != "" {
			key, err := api.DecodeCursor("vt1", in.Cursor)
			if err != nil {
				return api.Page[SandboxTemplate]{}, err
			}
			after = key
		}
		rows, err := c.Tx.Query(ctx, `SELECT `+templateColumns+templateFrom+` WHERE t.tenant_id = $1 AND t.name > $2 AND t.deleted_at IS NULL
			ORDER BY t.name LIMIT $3`, c.Target.TenantID, after, in.PageLimit()+1)
		if err != nil {
			return api.Page[SandboxTemplate]{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SandboxTemplate, error) { return scanTemplate(r) })
		if err != nil {
			return api.Page[SandboxTemplate]{}, err
		}
		return api.PageOf(items, in.PageLimit(), "vt1", func(t SandboxTemplate) string { return t.Name }), nil
	})
	modules.Handle(r, SandboxTemplatesDelete, templateTarget, deleteTemplate)

	modules.Handle(r, SandboxesCreate, nil, createSandbox)
	modules.Handle(r, SandboxesGet, sandboxTarget, func(ctx context.Context, c *modules.Call, _ SandboxRef) (Sandbox, error) {
		return getSandbox(ctx, c.Tx, c.Target.ResourceID)
	})
	modules.Handle(r, SandboxesList, nil, listSandboxes)
	for _, p := range []struct {
		m     api.Method[SandboxRef, Sandbox]
		power string
	}{{SandboxesPause, PowerPaused}, {SandboxesResume, PowerRunning}} {
		set := setPower(p.power)
		modules.Handle(r, p.m, sandboxTarget, func(ctx context.Context, c *modules.Call, _ SandboxRef) (Sandbox, error) {
			if _, err := set(ctx, c, InstanceRef{}); err != nil {
				return Sandbox{}, err
			}
			return getSandbox(ctx, c.Tx, c.Target.ResourceID)
		})
	}
	modules.Handle(r, SandboxesExtend, func(ctx context.Context, l modules.Lookup, in ExtendSandbox) (modules.Target, error) {
		return sandboxTarget(ctx, l, in.SandboxRef)
	}, extendSandbox)
	modules.Handle(r, SandboxesDelete, sandboxTarget, func(ctx context.Context, c *modules.Call, _ SandboxRef) (Sandbox, error) {
		if err := endInstance(ctx, c, c.Target.ResourceID, "deleted"); err != nil {
			return Sandbox{}, err
		}
		return getSandbox(ctx, c.Tx, c.Target.ResourceID)
	})
	modules.Handle(r, SandboxesConsole, sandboxTarget, func(ctx context.Context, c *modules.Call, _ SandboxRef) (api.TunnelTicket, error) {
		return consoleTicket(ctx, c, hostapi.ConsoleName)
	})
	modules.Handle(r, SandboxesSSH, sandboxTarget, func(ctx context.Context, c *modules.Call, _ SandboxRef) (api.TunnelTicket, error) {
		return consoleTicket(ctx, c, hostapi.AgentName)
	})
	m.registerSnapshots(r)
}

func createTemplate(ctx context.Context, c *modules.Call, in CreateSandboxTemplate) (SandboxTemplate, error) {
	ttl, maxTTL, warmup, err := in.Durations()
	if err != nil {
		return SandboxTemplate{}, err
	}
	pool, err := c.Runtime.Fleet.PoolID(ctx, c.Tx, c.Target.TenantID, in.Pool)
	if err != nil {
		return SandboxTemplate{}, err
	}
	f, err := flavorOf(ctx, c.Tx, c.Target.TenantID, in.Flavor)
	if err != nil {
		return SandboxTemplate{}, err
	}
	img, err := imageOf(ctx, c.Tx, c.Target.TenantID, in.Image)
	if err != nil {
		return SandboxTemplate{}, err
	}
	env := in.Env
	if env == nil {
		env = map[string]string{}
	}
	network := NetNone
	if in.Network != "" && in.Network != NetNone {
		n, err := networkOf(ctx, c.Tx, c.Target.TenantID, in.Network)
		if err != nil {
			return SandboxTemplate{}, err
		}
		network = n.ID
	}
	id := uuid.Must(uuid.NewV7()).String()
	_, err = c.Tx.Exec(ctx, `INSERT INTO compute.vps_sandbox_templates (id, tenant_id, name, pool_id, flavor_id, image_id, env, network, ttl, max_ttl, warm, warmup,
			ready_line, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		id, c.Target.TenantID, in.Name, pool, f.ID, img.ID, env, network, ttl, maxTTL, in.Warm, warmup, in.ReadyLine, c.Principal.ID)
	if postgres.ErrorCode(err) == postgres.UniqueViolation {
		return SandboxTemplate{}, api.Errorf(api.CodeConflict, "the tenant has a template named %q", in.Name).With("reason", "name_taken")
	}
	if err != nil {
		return SandboxTemplate{}, err
	}
	return scanTemplate(c.Tx.QueryRow(ctx, `SELECT `+templateColumns+templateFrom+` WHERE t.id = $1`, id))
}

// deleteTemplate retires a template no live sandbox uses, and ends its warm instances.
func deleteTemplate(ctx context.Context, c *modules.Call, in SandboxTemplateRef) (SandboxTemplate, error) {
	if _, err := c.Tx.Exec(ctx, `SELECT 1 FROM compute.vps_sandbox_templates WHERE id = $1 FOR UPDATE`, c.Target.ResourceID); err != nil {
		return SandboxTemplate{}, err
	}
	var n int
	if err := c.Tx.QueryRow(ctx, `SELECT count(*) FROM compute.vps_instances WHERE template_id = $1 AND kind = 'sandbox' AND deleted_at IS NULL`,
		c.Target.ResourceID).Scan(&n); err != nil {
		return SandboxTemplate{}, err
	}
	if n > 0 {
		return SandboxTemplate{}, api.Errorf(api.CodeFailedPrecondition, "template %s has %d live sandbox(es): delete them first", in.Template, n).With("reason", "in_use")
	}
	rows, err := c.Tx.Query(ctx, `SELECT id::text FROM compute.vps_instances WHERE template_id = $1 AND kind = 'warm' AND deleted_at IS NULL`, c.Target.ResourceID)
	if err != nil {
		return SandboxTemplate{}, err
	}
	warm, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return SandboxTemplate{}, err
	}
	for _, id := range warm {
		if err := endInstance(ctx, c, id, "template deleted"); err != nil {
			return SandboxTemplate{}, err
		}
	}
	t, err := scanTemplate(c.Tx.QueryRow(ctx, `UPDATE compute.vps_sandbox_templates t SET deleted_at = compute.compute_now()
		FROM compute.vps_flavors f, compute.vps_images m WHERE t.id = $1 AND f.id = t.flavor_id AND m.id = t.image_id RETURNING `+templateColumns, c.Target.ResourceID))
	return t, err
}

// endInstance releases a live instance's reservation and records its end; one already ended is
// left as it is.
func endInstance(ctx context.Context, c *modules.Call, id, reason string) error {
	i, err := getInstance(ctx, c.Tx, id)
	if err != nil || i.DeletedAt != nil {
		return err
	}
	if err := c.Runtime.Capacity.Release(ctx, c, i.ReservationID); err != nil {
		return fmt.Errorf("vps: release %s %s's reservation: %w", i.kind, i.ID, err)
	}
	_, err = deleteInstance(ctx, c.Tx, c.Runtime, i, reason)
	return err
}

// createSandbox takes a warm instance of the template when one waits paused (it only has to be
// resumed), and otherwise books and boots one.
func createSandbox(ctx context.Context, c *modules.Call, in CreateSandbox) (Sandbox, error) {
	var t struct {
		id, pool, flavor, image, network string
		ttl, maxTTL                      time.Duration
	}
	err := c.Tx.QueryRow(ctx, `SELECT id::text, pool_id::text, flavor_id::text, image_id::text, network, ttl, max_ttl FROM compute.vps_sandbox_templates
		WHERE tenant_id = $1 AND (id::text = $2 OR name = $2) AND deleted_at IS NULL ORDER BY (id::text = $2) DESC LIMIT 1 FOR SHARE`,
		c.Target.TenantID, in.Template).Scan(&t.id, &t.pool, &t.flavor, &t.image, &t.network, &t.ttl, &t.maxTTL)
	if errors.Is(err, pgx.ErrNoRows) {
		return Sandbox{}, api.NotFound("template", in.Template)
	}
	if err != nil {
		return Sandbox{}, err
	}
	ttl := t.ttl
	if in.TTL != "" {
		if ttl, err = api.ParseDuration("ttl", in.TTL); err != nil {
			return Sandbox{}, err
		}
		if ttl > t.maxTTL {
			return Sandbox{}, api.InvalidField("ttl", "%s is longer than the template's maxTTL %s", ttl, t.maxTTL)
		}
	}
	labels := in.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	// A warm one: the oldest that waits paused, not one another call is taking, on a host that
	// is online and reaches its runtime (one that does not could not resume it).
	var warm string
	err = c.Tx.QueryRow(ctx, `SELECT w.id::text FROM compute.vps_sandbox_templates t, compute.vps_instances w `+warmReadySQL+`
		AND t.id = $1 ORDER BY w.created_at LIMIT 1 FOR UPDATE OF w SKIP LOCKED`, t.id).Scan(&warm)
	switch {
	case err == nil:
		name := in.Name
		if name == "" {
			name = "sbx-" + warm[len(warm)-12:]
		}
		var node string
		err = c.Tx.QueryRow(ctx, `UPDATE compute.vps_instances SET kind = 'sandbox', name = $2, power = 'running', labels = $3, created_by = $4,
			created_at = compute.compute_now(), expires_at = compute.compute_now() + $5::interval, from_warm_pool = true
			WHERE id = $1 RETURNING node_id::text`, warm, name, labels, c.Principal.ID, ttl).Scan(&node)
		if postgres.ErrorCode(err) == postgres.UniqueViolation {
			return Sandbox{}, api.Errorf(api.CodeConflict, "the tenant has a live instance or sandbox named %q", name).With("reason", "name_taken")
		}
		if err != nil {
			return Sandbox{}, err
		}
		if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, node); err != nil {
			return Sandbox{}, err
		}
		if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventSandboxCreated, TenantID: c.Target.TenantID, Subject: warm,
			Data: map[string]any{"name": name, "template": t.id, "node": node, "fromWarmPool": true}}); err != nil {
			return Sandbox{}, err
		}
		return getSandbox(ctx, c.Tx, warm)
	case !errors.Is(err, pgx.ErrNoRows):
		return Sandbox{}, err
	}
	f, img, err := templateParts(ctx, c.Tx, t.flavor, t.image)
	if err != nil {
		return Sandbox{}, err
	}
	i, err := launch(ctx, c, launchSpec{kind: kindSandbox, name: in.Name, pool: t.pool, flavor: f, image: img, labels: labels, template: t.id, ttl: ttl,
		networks: templateNICs(t.network)})
	if err != nil {
		return Sandbox{}, err
	}
	return getSandbox(ctx, c.Tx, i.ID)
}

// templateParts reads a template's flavor and image by id (retired or not: the template keeps
// them).
func templateParts(ctx context.Context, q postgres.Querier, flavorID, imageID string) (Flavor, VMImage, error) {
	f, err := scanFlavor(q.QueryRow(ctx, `SELECT `+flavorColumns+` FROM compute.vps_flavors WHERE id = $1`, flavorID))
	if err != nil {
		return f, VMImage{}, err
	}
	img, err := scanImage(q.QueryRow(ctx, `SELECT `+imageColumns+` FROM compute.vps_images WHERE id = $1`, imageID))
	return f, img, err
}

func listSandboxes(ctx context.Context, c *modules.Call, in ListSandboxes) (api.Page[Sandbox], error) {
	var before *string
	if in.Cursor != "" {
		key, err := api.DecodeCursor("vs1", in.Cursor)
		if err != nil {
			return api.Page[Sandbox]{}, err
		}
		before = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+sandboxColumns+sandboxFrom+` WHERE i.tenant_id = $1 AND i.kind = 'sandbox' AND ($2::text IS NULL OR i.id::text < $2)
		AND ($3 = '' OR t.id::text = $3 OR t.name = $3) AND ($4 OR i.deleted_at IS NULL) ORDER BY i.id DESC LIMIT $5`,
		c.Target.TenantID, before, in.Template, in.Deleted, limit+1)
	if err != nil {
		return api.Page[Sandbox]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Sandbox, error) { return scanSandbox(r) })
	if err != nil {
		return api.Page[Sandbox]{}, err
	}
	return api.PageOf(items, limit, "vs1", func(s Sandbox) string { return s.ID }), nil
}

// extendSandbox moves a live sandbox's expiry to now + ttl, within its template's maxTTL of its
// creation.
func extendSandbox(ctx context.Context, c *modules.Call, in ExtendSandbox) (Sandbox, error) {
	ttl, err := api.ParseDuration("ttl", in.TTL)
	if err != nil {
		return Sandbox{}, err
	}
	var deleted bool
	var latest time.Time
	err = c.Tx.QueryRow(ctx, `SELECT i.deleted_at IS NOT NULL, i.created_at + t.max_ttl FROM compute.vps_instances i
		JOIN compute.vps_sandbox_templates t ON t.id = i.template_id WHERE i.id = $1 FOR UPDATE OF i`, c.Target.ResourceID).Scan(&deleted, &latest)
	if err != nil {
		return Sandbox{}, err
	}
	if deleted {
		return Sandbox{}, api.Errorf(api.CodeFailedPrecondition, "sandbox %s has ended", in.Sandbox).With("reason", "deleted")
	}
	var ok bool
	if err := c.Tx.QueryRow(ctx, `UPDATE compute.vps_instances SET expires_at = compute.compute_now() + $2::interval
		WHERE id = $1 AND compute.compute_now() + $2::interval <= $3 RETURNING true`, c.Target.ResourceID, ttl, latest).
		Scan(&ok); errors.Is(err, pgx.ErrNoRows) {
		return Sandbox{}, api.Errorf(api.CodeFailedPrecondition, "a ttl of %s would take sandbox %s past its template's maxTTL, at %s", ttl, in.Sandbox,
			latest.UTC().Format(time.RFC3339)).With("reason", "max_ttl")
	} else if err != nil {
		return Sandbox{}, err
	}
	return getSandbox(ctx, c.Tx, c.Target.ResourceID)
}

// consoleTicket is a ticket to a serial port of c's instance or sandbox: its console
// (hostapi.ConsoleName) or its second port (hostapi.AgentName).
func consoleTicket(ctx context.Context, c *modules.Call, port func(string) string) (api.TunnelTicket, error) {
	i, err := getInstance(ctx, c.Tx, c.Target.ResourceID)
	if err != nil {
		return api.TunnelTicket{}, err
	}
	if i.DeletedAt != nil {
		return api.TunnelTicket{}, api.Errorf(api.CodeFailedPrecondition, "%s %s was deleted", i.kind, i.Name).With("reason", "deleted")
	}
	return c.Runtime.Access.ConsoleTicket(ctx, c, api.OpenTunnel{Reservation: i.ReservationID, Node: i.NodeID, Console: port(i.ID)})
}

// sandboxRound is one round of the sandbox worker: it ends the sandboxes whose time ran out,
// pauses the warm instances that have run their warmup, drops warm ones in error, and refills
// the warm pools.
func sandboxRound(ctx context.Context, rt *modules.Runtime) error {
	type doomed struct{ id, tenant, reason string }
	var ends []doomed
	err := rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		// Expired sandboxes; warm ones in error, or that did not print their ready line in time.
		rows, err := tx.Query(ctx, `SELECT i.id::text, i.tenant_id, CASE WHEN i.kind = 'sandbox' THEN 'expired' ELSE 'warm instance failed' END
			FROM compute.vps_instances i LEFT JOIN compute.vps_sandbox_templates t ON t.id = i.template_id WHERE i.deleted_at IS NULL AND (
				(i.kind = 'sandbox' AND i.expires_at <= compute.compute_now()) OR (i.kind = 'warm' AND i.status = 'error') OR
				(i.kind = 'warm' AND t.ready_line <> '' AND NOT i.ready AND i.power = 'running' AND i.created_at + t.warmup <= compute.compute_now()))`)
		if err != nil {
			return err
		}
		ends, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (doomed, error) {
			var d doomed
			return d, r.Scan(&d.id, &d.tenant, &d.reason)
		})
		if err != nil {
			return err
		}
		// Warm ones up (their ready line seen, or run their warmup): paused, to wait.
		rows, err = tx.Query(ctx, `UPDATE compute.vps_instances i SET power = 'paused' FROM compute.vps_sandbox_templates t
			WHERE t.id = i.template_id AND i.kind = 'warm' AND i.deleted_at IS NULL AND i.power = 'running' AND i.status = 'running'
			AND (i.ready OR (t.ready_line = '' AND i.status_at + t.warmup <= compute.compute_now())) RETURNING i.node_id::text`)
		if err != nil {
			return err
		}
		nodes, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(nodes) == 0 {
			return err
		}
		return rt.Nodes.BumpDesired(ctx, tx, nodes...)
	})
	if err != nil {
		return err
	}
	for _, d := range ends {
		if err := asModule(ctx, rt, d.tenant, func(c *modules.Call) error {
			if _, err := c.Tx.Exec(ctx, `SELECT 1 FROM compute.vps_instances WHERE id = $1 FOR UPDATE`, d.id); err != nil {
				return err
			}
			return endInstance(ctx, c, d.id, d.reason)
		}); err != nil {
			return err
		}
	}
	return refill(ctx, rt)
}

// refill boots the warm instances the templates lack. A pool without room is tried again next
// round.
func refill(ctx context.Context, rt *modules.Runtime) error {
	type want struct {
		id, tenant, pool, flavor, image, network string
		missing                                  int
	}
	rows, err := rt.DB.Pool.Query(ctx, `SELECT t.id::text, t.tenant_id, t.pool_id::text, t.flavor_id::text, t.image_id::text, t.network,
		t.warm - (SELECT count(*) FROM compute.vps_instances w WHERE w.template_id = t.id AND w.kind = 'warm' AND w.deleted_at IS NULL)
		FROM compute.vps_sandbox_templates t WHERE t.deleted_at IS NULL AND t.warm > 0`)
	if err != nil {
		return err
	}
	wants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (want, error) {
		var w want
		return w, r.Scan(&w.id, &w.tenant, &w.pool, &w.flavor, &w.image, &w.network, &w.missing)
	})
	if err != nil {
		return err
	}
	for _, w := range wants {
		for range w.missing {
			err := asModule(ctx, rt, w.tenant, func(c *modules.Call) error {
				// Counted again under the template's lock: two workers never overfill it.
				var missing int
				if err := c.Tx.QueryRow(ctx, `SELECT t.warm - (SELECT count(*) FROM compute.vps_instances w WHERE w.template_id = t.id AND w.kind = 'warm'
					AND w.deleted_at IS NULL) FROM compute.vps_sandbox_templates t WHERE t.id = $1 AND t.deleted_at IS NULL FOR UPDATE`, w.id).Scan(&missing); err != nil {
					return err
				}
				if missing <= 0 {
					return nil
				}
				f, img, err := templateParts(ctx, c.Tx, w.flavor, w.image)
				if err != nil {
					return err
				}
				_, err = launch(ctx, c, launchSpec{kind: kindWarm, name: "warm-" + uuid.NewString()[:13], pool: w.pool, flavor: f, image: img, template: w.id,
					networks: templateNICs(w.network)})
				return err
			})
			if errors.Is(err, pgx.ErrNoRows) {
				break // the template went
			}
			if c := api.CodeOf(err); c == api.CodeConflict || c == api.CodeFailedPrecondition || c == api.CodeQuotaExceeded {
				rt.Logger.Debug("vps: a warm pool waits for room", "template", w.id, "error", err)
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// asModule runs fn in a transaction as a call of the module itself in tenant: what its workers
// book and release is booked and released as the tenant's, under the tenant's quotas.
func asModule(ctx context.Context, rt *modules.Runtime, tenant string, fn func(c *modules.Call) error) error {
	path, err := rt.IAM.TenantPath(ctx, tenant)
	if err != nil {
		return err
	}
	return rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		return fn(&modules.Call{Principal: warmPrincipal, Target: modules.Target{TenantID: tenant, ResourceID: "*", TenantPath: path}, Tx: tx, Runtime: rt})
	})
}

// templateNICs are the NICs of a template's sandboxes: one on its network, or none.
func templateNICs(network string) []InstanceNIC {
	if network == "" || network == NetNone {
		return nil
	}
	return []InstanceNIC{{Network: network}}
}
