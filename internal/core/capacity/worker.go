package capacity

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// tickBatch bounds how many reservations one tick moves per transaction.
const tickBatch = 500

// billBatch bounds how many bookings one Bill hands over; the rest wait for the next.
const billBatch = 5000

// TickResult counts what a Tick did.
type TickResult struct {
	Activated, Ended int
}

// Tick moves reservations along the state table as compute_now() passes their edges: pending →
// active at the start; active → expired at the end (or preempted, when a normal booking decided
// it); pending → preempted when a preemption's time comes before the start. Each batch is one
// transaction that also refreshes the rollups of the nodes involved and writes the events.
// Rows another worker holds are skipped, so several workers may tick at once.
func Tick(ctx context.Context, db *postgres.DB) (TickResult, error) {
	var res TickResult
	for {
		n, err := tickBatchOnce(ctx, db, &res)
		if err != nil || n < tickBatch {
			return res, err
		}
	}
}

func tickBatchOnce(ctx context.Context, db *postgres.DB, res *TickResult) (int, error) {
	moved := 0
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		// Rollups before reservations: their state change touches what the nodes should hold.
		// The tick waits for no node: one a placer holds now is skipped, and so are the
		// reservations on it, until the next tick. A tick that waited for nodes while holding
		// others stalled every placer behind it (and lost deadlocks to them).
		nrows, err := tx.Query(ctx, `SELECT node_id::text FROM compute.node_capacity WHERE node_id IN (
			  SELECT b.node_id FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
			  WHERE r.state IN ('pending', 'active') AND (r.starts_at <= compute.compute_now() AND r.state = 'pending' OR r.ends_at <= compute.compute_now()))
			ORDER BY node_id FOR UPDATE SKIP LOCKED`)
		locked, err := collectNodes(nrows, err)
		if err != nil || len(locked) == 0 {
			return err
		}
		rows, err := tx.Query(ctx, `WITH due AS (
			  SELECT r.id FROM compute.reservations r
			  WHERE r.state IN ('pending', 'active') AND (r.starts_at <= compute.compute_now() AND r.state = 'pending' OR r.ends_at <= compute.compute_now())
			    AND NOT EXISTS (SELECT 1 FROM compute.bookings b WHERE b.reservation_id = r.id AND NOT b.node_id = ANY($2::uuid[]))
			  ORDER BY r.id LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED
			)
			UPDATE compute.reservations r SET
			  state = CASE
			    WHEN r.ends_at <= compute.compute_now() AND r.end_reason = 'preempted' THEN 'preempted'
			    WHEN r.ends_at <= compute.compute_now() AND r.state = 'active' THEN 'expired'
			    WHEN r.ends_at <= compute.compute_now() THEN 'expired'
			    ELSE 'active' END,
			  ended_at = CASE WHEN r.ends_at <= compute.compute_now() THEN r.ends_at END,
			  updated_at = compute.compute_now()
			FROM due WHERE r.id = due.id
			RETURNING r.id::text, r.tenant_id, r.pool_id::text, r.state, r.claims`, tickBatch, locked)
		if err != nil {
			return err
		}
		type change struct {
			id, tenant, pool, state string
			cl                      claims
		}
		var all []change
		var m change
		if _, err := pgx.ForEachRow(rows, []any{&m.id, &m.tenant, &m.pool, &m.state, &m.cl}, func() error {
			all = append(all, m)
			return nil
		}); err != nil {
			return err
		}
		// Quotas last, all of them at once (see docs/capacity.md, "Lock order").
		var keys []quotaKey
		for _, m := range all {
			if m.state != "active" {
				keys = append(keys, quotaKey{m.tenant, m.pool})
			}
		}
		if err := lockQuotaSets(ctx, tx, keys...); err != nil {
			return err
		}
		ids := make([]string, len(all))
		for i, m := range all {
			ids[i] = m.id
			if m.state == "active" {
				res.Activated++
				err = events.Emit(ctx, tx, "reservation.activated", m.tenant, m.id, nil)
			} else {
				res.Ended++
				if err = releaseQuota(ctx, tx, m.tenant, m.pool, m.cl); err == nil {
					err = events.Emit(ctx, tx, "reservation."+m.state, m.tenant, m.id, nil)
				}
			}
			if err != nil {
				return err
			}
		}
		moved = len(all)
		if moved == 0 {
			return nil
		}
		nodes, err := collectNodes(tx.Query(ctx, `SELECT DISTINCT node_id::text FROM compute.bookings WHERE reservation_id = ANY($1::uuid[]) ORDER BY 1`, ids))
		if err != nil {
			return err
		}
		return RefreshNodes(ctx, tx, nodes...)
	})
	return moved, err
}

// Meters that capacity bills in, besides gpu.<model>.hours.
var (
	MeterVCPUHours     = iam.Meter{Key: "vcpu.hours", Unit: "vCPU-hour", Description: "vCPUs reserved, by the hour."}
	MeterMemoryGiBHour = iam.Meter{Key: "memory.gib_hours", Unit: "GiB-hour", Description: "Memory reserved, by the GiB-hour."}
)

// GPUMeter is the meter of a GPU model: gpu.<model>.hours, counted in GPU-hours (a MIG slice as
// its fraction of the GPU's memory slices, a time-slice share as one over the shares).
func GPUMeter(model string) iam.Meter {
	return iam.Meter{Key: "gpu." + strings.ReplaceAll(model, "-", "_") + ".hours", Unit: "GPU-hour",
		Description: "Reserved " + model + " GPU time."}
}

func ensureMeters(ctx context.Context, rt *modules.Runtime) error {
	rows, err := rt.DB.Pool.Query(ctx, `SELECT DISTINCT model FROM compute.devices ORDER BY 1`)
	if err != nil {
		return err
	}
	models, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	meters := []iam.Meter{MeterVCPUHours, MeterMemoryGiBHour}
	for _, m := range models {
		meters = append(meters, GPUMeter(m))
	}
	return rt.IAM.EnsureMeters(ctx, meters)
}

// BillResult counts what a Bill run handed over.
type BillResult struct {
	Records, Duplicates int
}

// Bill hands reserved time to billing: for every booking, each clock hour of its range that has
// closed (the hour is over, or the booking ended within it) becomes one usage record, keyed by
// the booking and the hour, so a rerun or a crash between recording and advancing never bills
// twice. The booking's billed_until then moves past what was handed over.
func Bill(ctx context.Context, db *postgres.DB, port iam.Biller) (BillResult, error) {
	return bill(ctx, db, port, billBatch)
}

func bill(ctx context.Context, db *postgres.DB, port iam.Biller, batch int) (BillResult, error) {
	var res BillResult
	now, err := dbNow(ctx, db.Pool)
	if err != nil {
		return res, err
	}
	rows, err := db.Pool.Query(ctx, `SELECT b.id, r.tenant_id, r.created_by, r.id::text, r.pool_id::text, b.node_id::text, b.kind, b.model, b.units,
		  coalesce(b.billed_until, lower(b.during)), lower(b.during), upper(b.during), r.spot
		FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE (b.billed_until IS NULL OR upper_inf(b.during) OR b.billed_until < upper(b.during)) AND lower(b.during) < $1
		  -- Only bookings with a closed window to bill (closedWindows' first): the clock hour their
		  -- cursor is in is over, or they ended. Otherwise bookings with nothing closed yet would
		  -- fill every batch and those after them never be billed.
		  AND least(date_bin('1 hour', coalesce(b.billed_until, lower(b.during)), timestamptz '2000-01-01 00:00:00+00') + interval '1 hour',
		    upper(b.during)) <= $1
		ORDER BY b.id LIMIT $2`, now, batch)
	if err != nil {
		return res, err
	}
	type booking struct {
		id                                int64
		tenant, identity, res, pool, node string
		kind, model                       string
		units                             float64
		from, lower                       time.Time
		upper                             *time.Time
		spot                              bool
	}
	var todo []booking
	var b booking
	if _, err := pgx.ForEachRow(rows, []any{&b.id, &b.tenant, &b.identity, &b.res, &b.pool, &b.node, &b.kind, &b.model, &b.units,
		&b.from, &b.lower, &b.upper, &b.spot}, func() error {
		todo = append(todo, b)
		return nil
	}); err != nil {
		return res, err
	}
	ensured := map[string]bool{}
	for _, b := range todo {
		meter := MeterVCPUHours
		switch b.kind {
		case "gpu", "mig", "share":
			meter = GPUMeter(b.model)
		case "memory":
			meter = MeterMemoryGiBHour
		}
		if !ensured[meter.Key] {
			if err := port.EnsureMeters(ctx, []iam.Meter{meter}); err != nil {
				return res, err
			}
			ensured[meter.Key] = true
		}
		until := b.from
		for _, w := range closedWindows(b.from, b.upper, now) {
			u := iam.Usage{
				TenantID: b.tenant, Meter: meter.Key, IdentityID: b.identity, OccurredAt: w.start,
				Quantity:       round6(b.units * w.end.Sub(w.start).Hours()),
				Tags:           map[string]string{"reservation": b.res, "pool": b.pool, "node": b.node, "kind": b.kind, "spot": fmt.Sprint(b.spot)},
				IdempotencyKey: fmt.Sprintf("compute:booking:%d:%d", b.id, w.start.Unix()),
			}
			rc, err := port.RecordUsage(ctx, u)
			if err != nil {
				return res, fmt.Errorf("capacity: bill booking %d: %w", b.id, err)
			}
			if rc.Duplicate {
				res.Duplicates++
			} else {
				res.Records++
			}
			until = w.end
		}
		if until.After(b.from) {
			if _, err := db.Pool.Exec(ctx, `UPDATE compute.bookings SET billed_until = $2 WHERE id = $1`, b.id, until); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

type span struct{ start, end time.Time }

// closedWindows splits [from, upper) at clock hours and returns the parts that are over by now:
// whole hours that have passed, and the last part of a booking that has ended.
func closedWindows(from time.Time, upper *time.Time, now time.Time) []span {
	var out []span
	for t := from; t.Before(now); {
		next := t.Truncate(time.Hour).Add(time.Hour)
		end := next
		if upper != nil && upper.Before(end) {
			end = *upper
		}
		if end.After(now) || !end.After(t) {
			break
		}
		out = append(out, span{t, end})
		if upper != nil && !end.Before(*upper) {
			break
		}
		t = end
	}
	return out
}

func round6(x float64) float64 { return math.Round(x*1e6) / 1e6 }
