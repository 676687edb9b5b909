package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/modules"
)

// batchKey says which reservations.create calls may share a transaction: the common shape (whole
// GPUs of one model, now, one member, no labels, vCPUs or spot) of one tenant in one pool. Any
// other request is placed alone.
func batchKey(t modules.Target, in api.CreateReservation) string {
	if in.GPUs == 0 || in.Start != nil || in.MemberCount() != 1 || in.Spot || in.VCPUs != 0 || in.MemoryGiB != 0 ||
		len(in.RequireLabels) != 0 || len(in.AvoidLabels) != 0 {
		return ""
	}
	return t.TenantID + "\x00" + in.Pool + "\x00" + in.Model
}

// reserveBatch places calls that share a batch key in one transaction: one pool lookup, one
// quota lock, one lock of the best-fit candidate nodes for all of them, the plans made in Go over
// those nodes' snapshots, and one pipelined write. A call that does not fit the locked nodes, or
// would preempt, is sent back to be placed alone; an error of its own (quota) is its answer.
func reserveBatch(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, calls []*modules.BatchCall[api.CreateReservation]) ([]modules.BatchResult[api.Reservation], error) {
	out := make([]modules.BatchResult[api.Reservation], len(calls))
	first := calls[0]
	tenant := first.Target.TenantID
	pool, err := resolvePool(ctx, tx, first.Target.TenantPath, first.In.Pool)
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out, nil
	}
	now := pool.Now
	smallest := first.In.GPUs
	for _, c := range calls {
		smallest = min(smallest, c.In.GPUs)
	}
	q := fitAnySQL
	if first.In.Model != "" {
		q = fitModelSQL
	}
	q = strings.Replace(q, "LIMIT 1", "LIMIT $6", 1)
	rows, err := tx.Query(ctx, q+" SKIP LOCKED", pool.ID, first.In.Model, smallest, false, []string{}, len(calls))
	if err != nil {
		return nil, err
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		return c, r.Scan(&c.id, &c.name)
	})
	if err != nil {
		return nil, err
	}
	snaps, err := loadSnapshots(ctx, tx, cands, now)
	if err != nil {
		return nil, err
	}
	// Quotas after the nodes (see docs/capacity.md, "Lock order").
	quotas, err := lockQuotas(ctx, tx, tenant, pool.ID)
	if err != nil {
		return nil, err
	}

	var w batchWrite
	for i, c := range calls {
		in := c.In
		win, err := requestWindow(now, nil, in.Duration, in.End)
		if err == nil {
			err = quotas.check(tenant, requested(in))
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		// Best fit over the locked nodes: the one with the fewest free GPUs that fits.
		best, bestFree := -1, 0
		var bestPlan MemberPlan
		for j := range snaps {
			view := during(snaps[j], win.start, endOr(win.end))
			plan, ok := Plan(view, in.Shape, false)
			if !ok || len(plan.Preempts) > 0 {
				continue
			}
			if free := freeWhole(view); best < 0 || free < bestFree {
				best, bestFree, bestPlan = j, free, plan
			}
		}
		if best < 0 {
			out[i].Alone = true
			continue
		}
		cl := claims{GPUs: map[string]int{}}
		for _, pk := range bestPlan.Picks {
			cl.GPUs[pk.Model] += int(pk.Units)
		}
		if err := quotas.check(tenant, cl); err != nil {
			out[i].Err = err
			continue
		}
		quotas.add(cl)
		snap := &snaps[best]
		for _, pk := range bestPlan.Picks {
			snap.Held = append(snap.Held, Held{Resource: pk.Resource, Span: pk.Span, From: win.start, To: win.end})
		}
		id := fleet.NewID()
		labels := in.Labels
		if labels == nil {
			labels = map[string]string{}
		}
		if err := w.add(id, c.Principal.ID, snap.NodeID, in.Shape, cl, labels, win, bestPlan.Picks); err != nil {
			return nil, err
		}
		out[i].Out = api.Reservation{
			ID: id, TenantID: tenant, PoolID: pool.ID, State: api.ReservationActive, Shape: in.Shape, Members: 1,
			StartsAt: win.start, EndsAt: win.end, Labels: labels, CreatedBy: c.Principal.ID, CreatedAt: now, UpdatedAt: now,
			Allocations: []api.Allocation{allocation(snap.NodeID, snap.Name, in.Shape, bestPlan.Picks, snap.GPUs)},
		}
	}
	if err := w.send(ctx, tx, tenant, pool.ID, now, quotas); err != nil {
		return nil, fmt.Errorf("capacity: write a batch of %d placements: %w", len(calls), err)
	}
	return out, nil
}

// batchWrite gathers a batch's rows so that they go out as a few multi-row statements, not a
// few statements per placement.
type batchWrite struct {
	ids, creators, shapes, claims, labels []string
	ends                                  []*time.Time
	starts                                []time.Time
	// bookings
	bres, bnodes, bkinds, bmodels []string
	blo, bhi                      []int32
	bunits                        []float64
	bstarts                       []time.Time
	bends                         []*time.Time
	// the nodes that take bookings, and the quota the claims add to
	taken map[string]bool
	total claims
}

func (w *batchWrite) add(id, creator, node string, shape api.Shape, cl claims, labels map[string]string, win window, picks []Pick) error {
	shapeJSON, err1 := json.Marshal(shape)
	claimsJSON, err2 := json.Marshal(cl)
	labelsJSON, err3 := json.Marshal(labels)
	if err := errors.Join(err1, err2, err3); err != nil {
		return err
	}
	w.ids = append(w.ids, id)
	w.creators = append(w.creators, creator)
	w.shapes = append(w.shapes, string(shapeJSON))
	w.claims = append(w.claims, string(claimsJSON))
	w.labels = append(w.labels, string(labelsJSON))
	w.starts = append(w.starts, win.start)
	w.ends = append(w.ends, win.end)
	if w.taken == nil {
		w.taken = map[string]bool{}
		w.total.GPUs = map[string]int{}
	}
	for _, p := range picks {
		w.bres = append(w.bres, id)
		w.bnodes = append(w.bnodes, node)
		w.bkinds = append(w.bkinds, p.Kind)
		w.bmodels = append(w.bmodels, p.Model)
		w.blo = append(w.blo, int32(p.Span.Lo))
		w.bhi = append(w.bhi, int32(p.Span.Hi))
		w.bunits = append(w.bunits, p.Units)
		w.bstarts = append(w.bstarts, win.start)
		w.bends = append(w.bends, win.end)
		w.taken[node] = true
		if p.Kind == "gpu" {
			w.total.GPUs[p.Model] += int(p.Units)
		}
	}
	return nil
}

func (w *batchWrite) send(ctx context.Context, tx pgx.Tx, tenant, pool string, now time.Time, quotas quotaRows) error {
	if len(w.ids) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO compute.reservations (id, tenant_id, pool_id, state, spot, shape, members, claims, starts_at, ends_at, labels, created_by, created_at, updated_at)
		SELECT u.id, $1, $2, 'active', false, u.shape::jsonb, 1, u.claims::jsonb, u.starts, u.ends, u.labels::jsonb, u.creator, $3, $3
		FROM unnest($4::uuid[], $5::text[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::text[])
		  AS u(id, shape, claims, starts, ends, labels, creator)`,
		tenant, pool, now, w.ids, w.shapes, w.claims, w.starts, w.ends, w.labels, w.creators)
	b.Queue(`INSERT INTO compute.bookings (reservation_id, member, node_id, resource, kind, model, units, atoms, during, spot)
		SELECT u.r, 0, u.n, 'gpu', u.k, u.m, u.units, int4range(u.lo, u.hi), tstzrange(u.s, u.e, '[)'), false
		FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::float8[], $6::int[], $7::int[], $8::timestamptz[], $9::timestamptz[])
		  AS u(r, n, k, m, units, lo, hi, s, e)`,
		w.bres, w.bnodes, w.bkinds, w.bmodels, w.bunits, w.blo, w.bhi, w.bstarts, w.bends)
	// Recounted, not decremented: see refreshSQL. The candidates are locked already.
	b.Queue(refreshSQL, sortedKeys(w.taken))
	quotas.queue(b, tenant, pool, w.total)
	b.Queue(`INSERT INTO compute.events (type, tenant_id, subject, data)
		SELECT 'reservation.created', $1, u.id::text, jsonb_build_object('pool', $2::text, 'state', 'active', 'spot', false)
		FROM unnest($3::uuid[]) AS u(id)`, tenant, pool, w.ids)
	return tx.SendBatch(ctx, b).Close()
}

// loadSnapshots reads the devices and the bookings from now on of several locked nodes.
// candidate is a locked node.
type candidate struct{ id, name string }

func loadSnapshots(ctx context.Context, tx pgx.Tx, cands []candidate, now time.Time) ([]NodeSnapshot, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	ids := make([]string, len(cands))
	index := map[string]int{}
	snaps := make([]NodeSnapshot, len(cands))
	for i, c := range cands {
		ids[i], index[c.id] = c.id, i
		snaps[i] = NodeSnapshot{NodeID: c.id, Name: c.name}
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT node_id::text, index, uuid, model, nvlink_domain, mode, shares, health <> 'unhealthy' FROM compute.devices
		WHERE node_id = ANY($1::uuid[]) ORDER BY node_id, index`, ids).Query(func(rows pgx.Rows) error {
		var node string
		var g GPUState
		_, err := pgx.ForEachRow(rows, []any{&node, &g.Index, &g.UUID, &g.Model, &g.Domain, &g.Mode, &g.Shares, &g.Healthy}, func() error {
			snaps[index[node]].GPUs = append(snaps[index[node]].GPUs, g)
			return nil
		})
		return err
	})
	b.Queue(`SELECT node_id::text, resource, lower(atoms), upper(atoms), spot, reservation_id::text, lower(during), upper(during)
		FROM compute.bookings WHERE node_id = ANY($1::uuid[]) AND during && tstzrange($2, NULL)`, ids, now).Query(func(rows pgx.Rows) error {
		var node string
		var h Held
		_, err := pgx.ForEachRow(rows, []any{&node, &h.Resource, &h.Span.Lo, &h.Span.Hi, &h.Spot, &h.Reservation, &h.From, &h.To}, func() error {
			snaps[index[node]].Held = append(snaps[index[node]].Held, h)
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("capacity: read candidate nodes: %w", err)
	}
	return snaps, nil
}

// freeWhole counts the whole-mode GPUs of a snapshot with nothing held on them.
func freeWhole(n NodeSnapshot) int {
	free := 0
	for _, g := range n.GPUs {
		if g.Mode == api.GPUModeWhole && g.Healthy && !hardHeld(n.Held, "gpu", GPUSpan(g.Index)) {
			free++
		}
	}
	return free
}

// endOr is the end of a window for overlap tests: far in the future when there is none.
func endOr(t *time.Time) time.Time {
	if t == nil {
		return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return *t
}
