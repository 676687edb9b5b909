package capacity

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// HorizonDefault is how far reservations.availability looks by default.
const HorizonDefault = 30 * 24 * time.Hour

// poolSnapshots reads every schedulable node of a pool with the bookings that overlap [from, to).
func poolSnapshots(ctx context.Context, q postgres.Querier, pool string, from, to time.Time) ([]NodeSnapshot, error) {
	rows, err := q.Query(ctx, `SELECT n.id::text, n.name, coalesce(r.vcpus, 0), coalesce(r.memory_gib, 0)
		FROM compute.nodes n LEFT JOIN compute.node_resources r ON r.node_id = n.id
		WHERE n.pool_id = $1 AND n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy' ORDER BY n.id`, pool)
	if err != nil {
		return nil, err
	}
	var snaps []NodeSnapshot
	index := map[string]int{}
	var s NodeSnapshot
	if _, err := pgx.ForEachRow(rows, []any{&s.NodeID, &s.Name, &s.VCPUs, &s.MemoryGiB}, func() error {
		index[s.NodeID] = len(snaps)
		snaps = append(snaps, NodeSnapshot{NodeID: s.NodeID, Name: s.Name, VCPUs: s.VCPUs, MemoryGiB: s.MemoryGiB})
		return nil
	}); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, `SELECT d.node_id::text, d.index, d.uuid, d.model, d.nvlink_domain, d.mode, d.shares, d.health <> 'unhealthy'
		FROM compute.devices d JOIN compute.nodes n ON n.id = d.node_id WHERE n.pool_id = $1 ORDER BY d.node_id, d.index`, pool)
	if err != nil {
		return nil, err
	}
	var node string
	var g GPUState
	if _, err := pgx.ForEachRow(rows, []any{&node, &g.Index, &g.UUID, &g.Model, &g.Domain, &g.Mode, &g.Shares, &g.Healthy}, func() error {
		if i, ok := index[node]; ok {
			snaps[i].GPUs = append(snaps[i].GPUs, g)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, `SELECT b.node_id::text, b.resource, lower(b.atoms), upper(b.atoms), b.spot, b.reservation_id::text, lower(b.during), upper(b.during)
		FROM compute.bookings b JOIN compute.nodes n ON n.id = b.node_id
		WHERE n.pool_id = $1 AND b.during && tstzrange($2, $3, '[)')`, pool, from, to)
	if err != nil {
		return nil, err
	}
	var h Held
	if _, err := pgx.ForEachRow(rows, []any{&node, &h.Resource, &h.Span.Lo, &h.Span.Hi, &h.Spot, &h.Reservation, &h.From, &h.To}, func() error {
		if i, ok := index[node]; ok {
			snaps[i].Held = append(snaps[i].Held, h)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return snaps, nil
}

// during returns n with only the holds that overlap [from, to).
func during(n NodeSnapshot, from, to time.Time) NodeSnapshot {
	out := n
	out.Held = nil
	for _, h := range n.Held {
		if h.From.Before(to) && (h.To == nil || h.To.After(from)) {
			out.Held = append(out.Held, h)
		}
	}
	return out
}

// Earliest finds the earliest start at or after after, within horizon, at which members
// distinct nodes each fit shape for d. It tries after and every end of a booking: a window can
// only open when something ends. Spot bookings count as free, as a normal booking preempts them.
func Earliest(snaps []NodeSnapshot, shape api.Shape, members int, d time.Duration, after, horizon time.Time) (time.Time, []string, bool) {
	for _, t := range windowStarts(snaps, after, horizon) {
		var fit []string
		for _, n := range snaps {
			if _, ok := Plan(during(n, t, t.Add(d)), shape, false); ok {
				fit = append(fit, n.NodeID)
				if len(fit) == members {
					return t, fit, true
				}
			}
		}
	}
	return time.Time{}, nil, false
}

// windowStarts lists, in order and once each, the times a window can open at: after, and every
// end of a booking of snaps within horizon (a window only opens when something ends).
func windowStarts(snaps []NodeSnapshot, after, horizon time.Time) []time.Time {
	starts := []time.Time{after}
	for _, n := range snaps {
		for _, h := range n.Held {
			if h.To != nil && h.To.After(after) && !h.To.After(horizon) {
				starts = append(starts, *h.To)
			}
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	return slices.CompactFunc(starts, time.Time.Equal)
}

func availability(ctx context.Context, c *modules.Call, in api.Availability) (api.AvailabilityAnswer, error) {
	now, err := dbNow(ctx, c.Tx)
	if err != nil {
		return api.AvailabilityAnswer{}, err
	}
	if in.MIGProfile != "" {
		if _, ok := MIGProfile(in.Model, in.MIGProfile); !ok {
			return api.AvailabilityAnswer{}, migProfileError(in.Model, in.MIGProfile)
		}
	}
	d, _ := api.ParseDuration("duration", in.Duration)
	horizon := HorizonDefault
	if in.Horizon != "" {
		horizon, _ = api.ParseDuration("horizon", in.Horizon)
	}
	after := now
	if in.After != nil && in.After.After(now) {
		after = *in.After
	}
	last := after.Add(horizon)
	snaps, err := poolSnapshots(ctx, c.Tx, c.Target.ResourceID, after, last.Add(d))
	if err != nil {
		return api.AvailabilityAnswer{}, err
	}
	start, nodes, ok := Earliest(snaps, in.Shape, max(in.Members, 1), d, after, last)
	if !ok {
		return api.AvailabilityAnswer{Found: false}, nil
	}
	end := start.Add(d)
	names := make([]string, len(nodes))
	for i, id := range nodes {
		for _, s := range snaps {
			if s.NodeID == id {
				names[i] = s.Name
			}
		}
	}
	return api.AvailabilityAnswer{Found: true, Start: &start, End: &end, Nodes: names}, nil
}

// search answers what is free in a pool for the whole of a window.
func search(ctx context.Context, c *modules.Call, in api.SearchCapacity) (api.CapacityWindow, error) {
	snaps, err := poolSnapshots(ctx, c.Tx, c.Target.ResourceID, in.Start, in.End)
	if err != nil {
		return api.CapacityWindow{}, err
	}
	out := api.CapacityWindow{PoolID: c.Target.ResourceID, Start: in.Start, End: in.End, Models: []api.ModelWindow{}}
	models := map[string]*api.ModelWindow{}
	for _, n := range snaps {
		freeOn := map[string]int{}
		for _, g := range n.GPUs {
			if g.Mode != api.GPUModeWhole || !g.Healthy {
				continue
			}
			m := models[g.Model]
			if m == nil {
				m = &api.ModelWindow{Model: g.Model}
				models[g.Model] = m
			}
			m.GPUs++
			if !hardHeld(n.Held, "gpu", GPUSpan(g.Index)) {
				m.Free++
				freeOn[g.Model]++
			}
		}
		for model, f := range freeOn {
			models[model].LargestBlock = max(models[model].LargestBlock, f)
		}
		out.VCPUsFree += n.VCPUs - heldUnits(n.Held, "cpu", n.VCPUs)
		out.MemoryGiBFree += n.MemoryGiB - heldUnits(n.Held, "memory", n.MemoryGiB)
	}
	for _, m := range models {
		out.Models = append(out.Models, *m)
	}
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })
	return out, nil
}

func hardHeld(held []Held, resource string, s Span) bool {
	for _, h := range held {
		if !h.Spot && h.Resource == resource && h.Span.Overlaps(s) {
			return true
		}
	}
	return false
}

// heldUnits counts the atoms of [0, total) that a normal booking holds at some point.
func heldUnits(held []Held, resource string, total int) int {
	n := 0
	for i := range total {
		if hardHeld(held, resource, Span{i, i + 1}) {
			n++
		}
	}
	return n
}

// Summary is a pool's capacity now, from the rollups (never the bookings).
func Summary(ctx context.Context, q postgres.Querier, pool string) (api.PoolCapacity, error) {
	out := api.PoolCapacity{PoolID: pool, Models: []api.ModelCapacity{}}
	const sched = `n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy'`
	err := q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE `+sched+`),
		  coalesce(sum(nc.vcpus_total) FILTER (WHERE `+sched+`), 0), coalesce(sum(nc.vcpus_used) FILTER (WHERE `+sched+`), 0), coalesce(sum(nc.vcpus_spot) FILTER (WHERE `+sched+`), 0),
		  coalesce(sum(nc.memory_total) FILTER (WHERE `+sched+`), 0), coalesce(sum(nc.memory_used) FILTER (WHERE `+sched+`), 0), coalesce(sum(nc.memory_spot) FILTER (WHERE `+sched+`), 0)
		FROM compute.nodes n LEFT JOIN compute.node_capacity nc ON nc.node_id = n.id WHERE n.pool_id = $1`, pool).
		Scan(&out.Nodes, &out.Schedulable, &out.VCPUs.Total, &out.VCPUs.Used, &out.VCPUs.Spot, &out.MemoryGiB.Total, &out.MemoryGiB.Used, &out.MemoryGiB.Spot)
	if err != nil {
		return out, err
	}
	out.VCPUs.Free = out.VCPUs.Total - out.VCPUs.Used - out.VCPUs.Spot
	out.MemoryGiB.Free = out.MemoryGiB.Total - out.MemoryGiB.Used - out.MemoryGiB.Spot
	rows, err := q.Query(ctx, `SELECT nc.gpu_model, sum(nc.gpus_total)::int, sum(nc.gpus_total - nc.gpus_free - nc.gpus_spot)::int, sum(nc.gpus_spot)::int, sum(nc.gpus_free)::int
		FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id
		WHERE nc.pool_id = $1 AND `+sched+` AND nc.gpus_total > 0 GROUP BY nc.gpu_model ORDER BY nc.gpu_model`, pool)
	if err != nil {
		return out, err
	}
	var m api.ModelCapacity
	_, err = pgx.ForEachRow(rows, []any{&m.Model, &m.Total, &m.Used, &m.Spot, &m.Free}, func() error {
		out.Models = append(out.Models, m)
		return nil
	})
	return out, err
}
