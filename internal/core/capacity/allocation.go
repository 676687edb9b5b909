package capacity

import (
	"context"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// allocation describes what picks hold on one node, in the API's terms.
func allocation(nodeID, name string, shape api.Shape, picks []Pick, gpus []GPUState) api.Allocation {
	a := api.Allocation{NodeID: nodeID, Node: name}
	byIndex := map[int]GPUState{}
	for _, g := range gpus {
		byIndex[g.Index] = g
	}
	var cpus []Span
	for _, p := range picks {
		switch p.Kind {
		case "gpu":
			for i := p.Span.Lo / PositionsPerGPU; i < p.Span.Hi/PositionsPerGPU; i++ {
				a.GPUs = append(a.GPUs, api.AllocatedGPU{Index: i, UUID: byIndex[i].UUID, Model: p.Model})
			}
		case "mig":
			i := p.Span.Lo / PositionsPerGPU
			a.GPUs = append(a.GPUs, api.AllocatedGPU{Index: i, UUID: byIndex[i].UUID, Model: p.Model,
				MIGProfile: shape.MIGProfile, MIGStart: (p.Span.Lo % PositionsPerGPU) / MIGSliceWidth})
		case "share":
			i := p.Span.Lo / PositionsPerGPU
			share := p.Span.Lo % PositionsPerGPU
			a.GPUs = append(a.GPUs, api.AllocatedGPU{Index: i, UUID: byIndex[i].UUID, Model: p.Model, Share: &share})
		case "vcpu":
			cpus = append(cpus, p.Span)
			a.VCPUs += p.Span.Len()
		case "memory":
			a.MemoryGiB += p.Span.Len()
		}
	}
	a.CPUSet = cpuset(cpus)
	return a
}

// cpuset writes spans as a Linux cpuset list: "0-7,16-23".
func cpuset(spans []Span) string {
	sort.Slice(spans, func(i, j int) bool { return spans[i].Lo < spans[j].Lo })
	var parts []string
	for _, s := range spans {
		if s.Len() == 1 {
			parts = append(parts, strconv.Itoa(s.Lo))
		} else {
			parts = append(parts, strconv.Itoa(s.Lo)+"-"+strconv.Itoa(s.Hi-1))
		}
	}
	return strings.Join(parts, ",")
}

// loadAllocations reads what each reservation holds, member by member.
func loadAllocations(ctx context.Context, q postgres.Querier, shapes map[string]api.Shape) (map[string][]api.Allocation, error) {
	ids := make([]string, 0, len(shapes))
	for id := range shapes {
		ids = append(ids, id)
	}
	rows, err := q.Query(ctx, `SELECT b.reservation_id::text, b.member, b.node_id::text, n.name, b.resource, b.kind, b.model, lower(b.atoms), upper(b.atoms)
		FROM compute.bookings b JOIN compute.nodes n ON n.id = b.node_id
		WHERE b.reservation_id = ANY($1::uuid[]) ORDER BY b.reservation_id, b.member, b.id`, ids)
	if err != nil {
		return nil, err
	}
	type key struct {
		res    string
		member int
	}
	type member struct {
		node, name string
		picks      []Pick
	}
	members := map[key]*member{}
	var order []key
	nodes := map[string]bool{}
	var k key
	var node, name string
	var p Pick
	_, err = pgx.ForEachRow(rows, []any{&k.res, &k.member, &node, &name, &p.Resource, &p.Kind, &p.Model, &p.Span.Lo, &p.Span.Hi}, func() error {
		m, ok := members[k]
		if !ok {
			m = &member{node: node, name: name}
			members[k] = m
			order = append(order, k)
		}
		m.picks = append(m.picks, p)
		nodes[node] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	gpus := map[string][]GPUState{}
	if len(nodes) > 0 {
		rows, err := q.Query(ctx, `SELECT node_id::text, index, uuid FROM compute.devices WHERE node_id = ANY($1::uuid[])`, sortedKeys(nodes))
		if err != nil {
			return nil, err
		}
		var n string
		var g GPUState
		if _, err := pgx.ForEachRow(rows, []any{&n, &g.Index, &g.UUID}, func() error {
			gpus[n] = append(gpus[n], g)
			return nil
		}); err != nil {
			return nil, err
		}
	}
	out := map[string][]api.Allocation{}
	for _, k := range order {
		m := members[k]
		out[k.res] = append(out[k.res], allocation(m.node, m.name, shapes[k.res], m.picks, gpus[m.node]))
	}
	return out, nil
}

// NodeHolds returns what each holder (reservation) holds on a node now, by holder, for the
// node's desired state.
func NodeHolds(ctx context.Context, q postgres.Querier, nodeID string) (map[string]api.Allocation, error) {
	rows, err := q.Query(ctx, `SELECT b.reservation_id::text, r.shape FROM compute.bookings b JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE b.node_id = $1 AND b.during @> compute.compute_now() AND r.state = 'active'`, nodeID)
	if err != nil {
		return nil, err
	}
	shapes := map[string]api.Shape{}
	var id string
	var shape api.Shape
	if _, err := pgx.ForEachRow(rows, []any{&id, &shape}, func() error {
		shapes[id] = shape
		return nil
	}); err != nil {
		return nil, err
	}
	out := map[string]api.Allocation{}
	if len(shapes) == 0 {
		return out, nil
	}
	all, err := loadAllocations(ctx, q, shapes)
	if err != nil {
		return nil, err
	}
	for res, allocs := range all {
		for _, a := range allocs {
			if a.NodeID == nodeID {
				out[res] = a
			}
		}
	}
	return out, nil
}
