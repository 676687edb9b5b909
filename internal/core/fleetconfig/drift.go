package fleetconfig

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// MaxDriftInEvent is how many changes a fleet.drifted event carries; fleet.drift has them all.
const MaxDriftInEvent = 50

// DriftArgs is the job of the periodic drift check, inserted by River's leader every
// Module.DriftEvery.
type DriftArgs struct{}

// Kind implements river.JobArgs.
func (DriftArgs) Kind() string { return "fleet.drift" }

type driftWorker struct {
	river.WorkerDefaults[DriftArgs]
	rt *modules.Runtime
}

func (w *driftWorker) Work(ctx context.Context, _ *river.Job[DriftArgs]) error {
	_, err := CheckDrift(ctx, w.rt)
	return err
}

// applied is the FleetConfig last applied to a tenant, and the drift last reported.
type applied struct {
	doc       api.FleetConfig
	prune     bool
	by        string
	at        time.Time
	fp        string
	driftHash string
}

// readApplied reads tenant's record; lock takes its row (skipping it if another transaction
// holds it). found is false when there is none, or it is locked.
func readApplied(ctx context.Context, q postgres.Querier, tenant string, lock bool) (applied, bool, error) {
	var a applied
	sql := `SELECT document, prune, applied_by, applied_at, fingerprint, drift_hash FROM compute.fleet_configs WHERE tenant_id = $1`
	if lock {
		sql += ` FOR UPDATE SKIP LOCKED`
	}
	err := q.QueryRow(ctx, sql, tenant).Scan(&a.doc, &a.prune, &a.by, &a.at, &a.fp, &a.driftHash)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false, nil
	}
	return a, err == nil, err
}

// driftOf compares the live state with a's document: the changes an apply of it would make now.
func driftOf(ctx context.Context, q postgres.Querier, tenant string, a applied) (*plan, error) {
	st, err := readState(ctx, q, tenant, nil)
	if err != nil {
		return nil, err
	}
	return diff(a.doc, st, a.prune, false)
}

// hashChanges is "" for no drift, else the hash of the changes' JSON: the same drift hashes the same.
func hashChanges(cs []api.FleetChange) string {
	if len(cs) == 0 {
		return ""
	}
	b, err := json.Marshal(cs)
	if err != nil {
		panic(fmt.Sprintf("fleetconfig: hash drift: %v", err))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// CheckDrift compares the live state of every tenant with an applied FleetConfig against that
// document. Where the drift is not the one last reported, it records it and emits fleet.drifted
// (or, drift gone, fleet.converged) in the same transaction, so a drift is told once however
// often it is checked, and again only when it changes. Each tenant is checked in a transaction of
// its own, its record locked; one being applied or checked elsewhere is skipped this round. It
// returns how many events it emitted.
func CheckDrift(ctx context.Context, rt *modules.Runtime) (int, error) {
	rows, err := rt.DB.Pool.Query(ctx, `SELECT tenant_id FROM compute.fleet_configs ORDER BY tenant_id`)
	if err != nil {
		return 0, err
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	emitted := 0
	var errs []error
	for _, tenant := range tenants {
		err := pgx.BeginFunc(ctx, rt.DB.Pool, func(tx pgx.Tx) error {
			told, err := checkTenant(ctx, tx, rt, tenant)
			if told {
				emitted++
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("fleetconfig: drift of tenant %s: %w", tenant, err))
		}
	}
	return emitted, errors.Join(errs...)
}

func checkTenant(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, tenant string) (bool, error) {
	a, ok, err := readApplied(ctx, tx, tenant, true)
	if err != nil || !ok {
		return false, err
	}
	p, err := driftOf(ctx, tx, tenant, a)
	if err != nil {
		return false, err
	}
	cs := p.changes()
	h := hashChanges(cs)
	if h == a.driftHash {
		_, err := tx.Exec(ctx, `UPDATE compute.fleet_configs SET drift_checked_at = compute.compute_now() WHERE tenant_id = $1`, tenant)
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.fleet_configs SET drift = $2, drift_hash = $3, drift_checked_at = compute.compute_now() WHERE tenant_id = $1`,
		tenant, cs, h); err != nil {
		return false, err
	}
	e := modules.Event{Type: EventConverged, TenantID: tenant, Subject: tenant, Data: map[string]any{"appliedBy": a.by, "appliedAt": a.at}}
	if len(cs) > 0 {
		e.Type = EventDrifted
		e.Data["count"] = len(cs)
		e.Data["changes"] = cs[:min(len(cs), MaxDriftInEvent)]
	}
	return true, rt.Events.Emit(ctx, tx, e)
}

func drift(ctx context.Context, c *modules.Call, _ api.GetFleetDrift) (api.DriftReport, error) {
	tenant := c.Target.TenantID
	rep := api.DriftReport{TenantID: tenant, Changes: []api.FleetChange{}, Kept: []api.FleetObject{}}
	if err := c.Tx.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&rep.CheckedAt); err != nil {
		return rep, err
	}
	rep.CheckedAt = rep.CheckedAt.UTC()
	a, ok, err := readApplied(ctx, c.Tx, tenant, false)
	if err != nil || !ok {
		return rep, err
	}
	text, err := Render(a.doc)
	if err != nil {
		return rep, err
	}
	rep.Applied = &api.FleetApplyRecord{AppliedBy: a.by, AppliedAt: a.at.UTC(), Fingerprint: a.fp, Prune: a.prune, Document: text}
	p, err := driftOf(ctx, c.Tx, tenant, a)
	if err != nil {
		return rep, err
	}
	rep.Changes, rep.Kept = p.changes(), p.kept
	rep.Drifted = len(rep.Changes) > 0
	return rep, nil
}
