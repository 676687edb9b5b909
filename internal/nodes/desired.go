package nodes

import (
	"context"
	"sort"
	"strings"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/capacity"
	"github.com/better-compute/compute/postgres"
)

// Desired returns what a node should hold now, at its current generation. The generation is read
// before the holds: if they move in between, the node gets newer holds under an older
// generation, and the next push corrects the generation; never the other way round.
func Desired(ctx context.Context, q postgres.Querier, nodeID string) (*agentv1.DesiredState, error) {
	var gen int64
	if err := q.QueryRow(ctx, `SELECT coalesce((SELECT generation FROM compute.node_desired WHERE node_id = $1), 1)`, nodeID).Scan(&gen); err != nil {
		return nil, err
	}
	holds, err := capacity.NodeHolds(ctx, q, nodeID)
	if err != nil {
		return nil, err
	}
	ds := &agentv1.DesiredState{Generation: gen}
	for holder, a := range holds {
		h := &agentv1.DeviceHold{Holder: holder, Cpuset: a.CPUSet, MemoryGib: int32(a.MemoryGiB)}
		for _, g := range a.GPUs {
			hg := &agentv1.HeldGPU{Index: int32(g.Index), Uuid: g.UUID, MigProfile: g.MIGProfile, MigStart: int32(g.MIGStart), Share: -1}
			if g.Share != nil {
				hg.Share = int32(*g.Share)
			}
			h.Gpus = append(h.Gpus, hg)
		}
		ds.Holds = append(ds.Holds, h)
	}
	sort.Slice(ds.Holds, func(i, j int) bool { return strings.Compare(ds.Holds[i].Holder, ds.Holds[j].Holder) < 0 })
	return ds, nil
}

// Applied is a node's acknowledgement of the desired state it applied: the generation, and the
// error it met ("" for none).
type Applied struct {
	Node       string
	Generation int64
	Error      string
}

// RecordApplied records nodes' acknowledgements. An applied generation never moves back: an
// acknowledgement that arrives late changes only the error.
func RecordApplied(ctx context.Context, q postgres.Querier, acks []Applied) error {
	ids, gens, errs := make([]string, len(acks)), make([]int64, len(acks)), make([]string, len(acks))
	for i, a := range acks {
		ids[i], gens[i], errs[i] = a.Node, a.Generation, a.Error
	}
	_, err := q.Exec(ctx, `UPDATE compute.node_desired d SET applied_generation = greatest(d.applied_generation, u.g), applied_error = u.e
		FROM unnest($1::uuid[], $2::bigint[], $3::text[]) AS u(n, g, e) WHERE d.node_id = u.n`, ids, gens, errs)
	return err
}
