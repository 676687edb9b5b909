package workflow

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

const runColumns = `r.id::text, r.workflow, r.tenant_id, r.subject, r.state, s.name, r.error, r.created_by, r.created_at, r.finished_at,
	(SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object('name', x.name, 'state', x.state, 'attempts', x.attempts, 'note', nullif(x.note, ''),
		'error', nullif(x.error, ''), 'startedAt', x.started_at, 'finishedAt', x.finished_at)) ORDER BY x.n)
	 FROM compute.workflow_steps x WHERE x.run_id = r.id)`

const runFrom = ` FROM compute.workflow_runs r JOIN compute.workflow_steps s ON s.run_id = r.id AND s.n = r.step`

func scanRun(row pgx.Row) (api.WorkflowRun, error) {
	var w api.WorkflowRun
	err := row.Scan(&w.ID, &w.Workflow, &w.TenantID, &w.Subject, &w.State, &w.Step, &w.Error, &w.CreatedBy, &w.CreatedAt, &w.FinishedAt, &w.Steps)
	return w, err
}

// Get reads a run with its steps.
func Get(ctx context.Context, q postgres.Querier, id string) (api.WorkflowRun, error) {
	w, err := scanRun(q.QueryRow(ctx, `SELECT `+runColumns+runFrom+` WHERE r.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return w, api.NotFound("workflow run", id)
	}
	return w, err
}

func runTarget(ctx context.Context, l modules.Lookup, in api.GetWorkflow) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "workflow run", Ref: in.Run, ResourceID: in.Run}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.workflow_runs WHERE id = $1`, in.Run).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("workflow run", in.Run)
	}
	return t, err
}

const cursorKind = "wf1"

func list(ctx context.Context, c *modules.Call, in api.ListWorkflows) (api.Page[api.WorkflowRun], error) {
	var before *string
	if in.Cursor != "" {
		key, err := api.DecodeIDCursor(cursorKind, in.Cursor)
		if err != nil {
			return api.Page[api.WorkflowRun]{}, err
		}
		before = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+runColumns+runFrom+` WHERE r.tenant_id = $1 AND ($2::uuid IS NULL OR r.id < $2)
		AND ($3 = '' OR r.workflow = $3) AND ($4 = '' OR r.subject = $4) AND ($5 = '' OR r.state = $5)
		ORDER BY r.id DESC LIMIT $6`, c.Target.TenantID, before, in.Workflow, in.Subject, in.State, limit+1)
	if err != nil {
		return api.Page[api.WorkflowRun]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.WorkflowRun, error) { return scanRun(r) })
	if err != nil {
		return api.Page[api.WorkflowRun]{}, err
	}
	return api.PageOf(items, limit, cursorKind, func(r api.WorkflowRun) string { return r.ID }), nil
}

// Running reports whether a run of workflow about subject is running whose input contains
// input (a JSON containment: {"gpu": 3} matches a run of GPU 3).
func Running(ctx context.Context, q postgres.Querier, workflow, subject string, input map[string]any) (bool, error) {
	if input == nil {
		input = map[string]any{}
	}
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.workflow_runs WHERE subject = $2 AND workflow = $1 AND state = 'running' AND input @> $3)`,
		workflow, subject, input).Scan(&ok)
	return ok, err
}
