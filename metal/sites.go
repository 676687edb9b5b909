package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// A site agent (bcd site, a node of role site in a pool of its site: joinTokens.create with
// role site) is given its site's plan as its desired state (the part siteapi.PlanKind) and
// reports back what its machines' ramdisks tell it (siteapi.Kind*). This file is the control
// plane's side of both.

// Events of the sites' reports.
const (
	EventTaskProgress = "metal.task_progress" // a machine's ramdisk task moved to another phase
	EventImageCache   = "metal.image_cache"   // a site cached an image, or failed to
	EventMachineSeen  = "metal.machine_seen"  // a known machine's ramdisk said hello
)

func (m *Module) registerSites(r *modules.Registry) {
	r.OnInitialize(func(_ context.Context, rt *modules.Runtime) error {
		m.secrets = rt.Secrets
		return nil
	})
	r.DesiredKind(modules.DesiredKind{Name: siteapi.PlanKind, Version: siteapi.PlanVersion, State: m.sitePlan})
	r.EventTypes(
		modules.EventType{Name: EventTaskProgress, Description: "A machine's ramdisk task moved to another phase (data: task, phase, bytes, total, error)."},
		modules.EventType{Name: EventImageCache, Description: "A site cached an image its plan names, or failed to (data: site, sha256, state, error)."},
		modules.EventType{Name: EventMachineSeen, Description: "A known machine's ramdisk said hello at its site (data: site, serial)."},
	)
	site := []string{api.RoleSite}
	r.ReportKind(
		modules.ReportKind{Name: siteapi.KindMachineSeen, Roles: site, Handle: machineSeen},
		modules.ReportKind{Name: siteapi.KindTaskProgress, Roles: site, Handle: taskProgress},
		modules.ReportKind{Name: siteapi.KindImageCached, Roles: site, Handle: imageCached},
	)
}

// sitePlan is a site agent's part of its desired state: its site's machines, what each boots and
// does, and the images their tasks need. Nodes that are not site agents have none.
func (m *Module) sitePlan(ctx context.Context, q postgres.Querier, nodeID string) (any, error) {
	var site *string
	err := q.QueryRow(ctx, `SELECT p.site_id::text FROM compute.nodes n JOIN compute.pools p ON p.id = n.pool_id
		WHERE n.id = $1 AND n.role = 'site'`, nodeID).Scan(&site)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && site == nil {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	plan := siteapi.Plan{Site: *site, Unknown: m.unknown, Machines: []siteapi.PlanMachine{}, Images: []siteapi.Image{}}
	rows, err := q.Query(ctx, `SELECT m.id::text, coalesce(array_agg(x.mac ORDER BY x.mac) FILTER (WHERE x.mac IS NOT NULL), '{}'), m.boot, m.task
		FROM compute.metal_machines m LEFT JOIN compute.metal_macs x ON x.machine_id = m.id
		WHERE m.site_id = $1 GROUP BY m.id ORDER BY m.id`, *site)
	if err != nil {
		return nil, err
	}
	images := map[string]bool{}
	for rows.Next() {
		var pm siteapi.PlanMachine
		var task []byte
		if err := rows.Scan(&pm.ID, &pm.MACs, &pm.Boot, &task); err != nil {
			rows.Close()
			return nil, err
		}
		if task != nil {
			pm.Task = new(siteapi.Task)
			if err := json.Unmarshal(task, pm.Task); err != nil {
				rows.Close()
				return nil, fmt.Errorf("metal: the task of machine %s: %w", pm.ID, err)
			}
			if im := pm.Task.Image; im != nil && !images[im.SHA256] {
				images[im.SHA256] = true
				plan.Images = append(plan.Images, *im)
			}
		}
		plan.Machines = append(plan.Machines, pm)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// An image's pull token goes to the site agents that fetch it, opened here: nowhere else.
	for i, im := range plan.Images {
		var sealed []byte
		if err := q.QueryRow(ctx, `SELECT pull_token FROM compute.metal_images WHERE id::text = $1`, im.ID).Scan(&sealed); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, err
		}
		if sealed == nil {
			continue
		}
		if m.secrets == nil {
			return nil, errors.New("metal: the module was not initialized (compute.Initialize)")
		}
		tok, err := m.secrets.Open(imagePurpose(im.ID), sealed)
		if err != nil {
			return nil, fmt.Errorf("metal: open the pull token of image %s: %w", im.ID, err)
		}
		plan.Images[i].Authorization = "Bearer " + string(tok)
	}
	return plan, nil
}

// bumpSite moves the desired state of a site's agents: their plan changed.
func bumpSite(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, site string) error {
	agents, err := rt.Fleet.SiteAgents(ctx, tx, site)
	if err != nil || len(agents) == 0 {
		return err
	}
	return rt.Nodes.BumpDesired(ctx, tx, agents...)
}

// reportSite is the site a report came from: the site of the agent's pool.
func reportSite(ctx context.Context, r *modules.Report) (string, error) {
	site, err := r.Runtime.Fleet.PoolSite(ctx, r.Tx, r.PoolID)
	if err == nil && site == "" {
		err = api.InvalidField("site", "the site agent's pool has no site any more")
	}
	return site, err
}

func decodeReport(r *modules.Report, v any) error {
	if err := json.Unmarshal(r.Payload, v); err != nil {
		return api.InvalidField("payload", "not a report of this kind: %v", err)
	}
	return nil
}

// machineSeen takes a ramdisk's hello: a machine of the site (named by the site, or found by a
// MAC) has its facts and its time seen recorded; an unknown one becomes a join request.
func machineSeen(ctx context.Context, r *modules.Report) error {
	var in siteapi.MachineSeen
	if err := decodeReport(r, &in); err != nil {
		return err
	}
	if err := checkFacts(in.Facts); err != nil {
		return err
	}
	site, err := reportSite(ctx, r)
	if err != nil {
		return err
	}
	var id, serial string
	err = r.Tx.QueryRow(ctx, `UPDATE compute.metal_machines m SET facts = $4, seen_at = compute.compute_now()
		WHERE m.tenant_id = $1 AND m.site_id = $2 AND (m.id::text = $3 OR m.id IN (SELECT machine_id FROM compute.metal_macs WHERE mac = ANY($5)))
		RETURNING m.id::text, $4::jsonb->>'serial'`, r.TenantID, site, in.Machine, in.Facts, in.Facts.MACs).Scan(&id, &serial)
	if errors.Is(err, pgx.ErrNoRows) {
		_, err = SubmitJoinRequest(ctx, r.Tx, r.Runtime, r.TenantID, site, in.Facts)
		return err
	}
	if err != nil {
		return err
	}
	return r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: EventMachineSeen, TenantID: r.TenantID, Subject: id,
		Data: map[string]any{"site": site, "serial": serial}})
}

// taskProgress records how far a machine's task has gone, with an event when its phase changes.
// Progress of a task the machine no longer has (an old ramdisk still talking) is refused.
func taskProgress(ctx context.Context, r *modules.Report) error {
	var p siteapi.Progress
	if err := decodeReport(r, &p); err != nil {
		return err
	}
	var fe *siteapi.FieldError
	if err := p.Validate(); errors.As(err, &fe) {
		return api.InvalidField(fe.Field, "%s", fe.Problem)
	}
	site, err := reportSite(ctx, r)
	if err != nil {
		return err
	}
	var current bool
	err = r.Tx.QueryRow(ctx, `SELECT task->>'id' = $3 FROM compute.metal_machines WHERE id::text = $1 AND tenant_id = $2 AND site_id = $4`,
		p.Machine, r.TenantID, p.Task, site).Scan(&current)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !current {
		return api.Errorf(api.CodeFailedPrecondition, "machine %s has no task %s at this site", p.Machine, p.Task)
	}
	if err != nil {
		return err
	}
	var changed bool
	err = r.Tx.QueryRow(ctx, `INSERT INTO compute.metal_task_progress AS t (task_id, machine_id, phase, bytes, total, error) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (task_id) DO UPDATE SET phase = excluded.phase, bytes = excluded.bytes, total = excluded.total, error = excluded.error,
		  updated_at = compute.compute_now()
		  -- a late duplicate does not move a finished task back
		  WHERE t.phase NOT IN ('done', 'failed')
		RETURNING xmax = 0 OR phase IS DISTINCT FROM (SELECT phase FROM compute.metal_task_progress WHERE task_id = $1)`,
		p.Task, p.Machine, p.Phase, p.Bytes, p.Total, p.Error).Scan(&changed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil || !changed {
		return err
	}
	return r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: EventTaskProgress, TenantID: r.TenantID, Subject: p.Machine,
		Data: map[string]any{"task": p.Task, "phase": p.Phase, "bytes": p.Bytes, "total": p.Total, "error": p.Error}})
}

// imageCached records a site's cache of an image.
func imageCached(ctx context.Context, r *modules.Report) error {
	var st siteapi.ImageState
	if err := decodeReport(r, &st); err != nil {
		return err
	}
	if !siteapi.ValidSHA256(st.SHA256) || (st.State != siteapi.ImageCached && st.State != siteapi.ImageFailed) {
		return api.InvalidField("payload", "an image state needs a sha256 and a state of cached or failed")
	}
	site, err := reportSite(ctx, r)
	if err != nil {
		return err
	}
	if _, err := r.Tx.Exec(ctx, `INSERT INTO compute.metal_site_images (site_id, sha256, state, error) VALUES ($1, $2, $3, $4)
		ON CONFLICT (site_id, sha256) DO UPDATE SET state = excluded.state, error = excluded.error, updated_at = compute.compute_now()`,
		site, st.SHA256, st.State, truncate(st.Error, 2048)); err != nil {
		return err
	}
	return r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: EventImageCache, TenantID: r.TenantID, Subject: site,
		Data: map[string]any{"sha256": st.SHA256, "state": st.State, "error": st.Error}})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// progressOf reads a task's last progress; ok is false before any.
func progressOf(ctx context.Context, q postgres.Querier, task string) (p TaskProgress, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT task_id, phase, bytes, total, error, updated_at FROM compute.metal_task_progress WHERE task_id = $1`, task).
		Scan(&p.ID, &p.Phase, &p.Bytes, &p.Total, &p.Error, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	return p, err == nil, err
}

// pollEvery is how often a workflow step looks again at what a site reports.
const pollEvery = 2 * time.Second
