package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// Desired returns what a node should hold now, at its current generation. The generation is read
// before the holds: if they move in between, the node gets newer holds under an older
// generation, and the next push corrects the generation; never the other way round. Each of
// kinds adds its part, when it has one for the node.
func Desired(ctx context.Context, q postgres.Querier, nodeID string, kinds []modules.DesiredKind) (*agentv1.DesiredState, error) {
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
	// The GPUs' modes (capacity's devices, read): the node sets its GPUs up by them.
	rows, err := q.Query(ctx, `SELECT index, uuid, mode, shares FROM compute.devices WHERE node_id = $1 ORDER BY index`, nodeID)
	if err != nil {
		return nil, err
	}
	ds.Gpus, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*agentv1.GPUSetting, error) {
		g := &agentv1.GPUSetting{}
		return g, r.Scan(&g.Index, &g.Uuid, &g.Mode, &g.Shares)
	})
	if err != nil {
		return nil, err
	}
	for _, k := range kinds {
		part, err := partOf(ctx, k, q, nodeID)
		if err != nil {
			return nil, fmt.Errorf("nodes: desired state %s of node %s: %w", k.Name, nodeID, err)
		}
		if part == nil {
			continue
		}
		b, err := json.Marshal(part)
		if err != nil {
			return nil, fmt.Errorf("nodes: desired state %s of node %s: %w", k.Name, nodeID, err)
		}
		ds.Parts = append(ds.Parts, &agentv1.DesiredPart{Kind: k.Name, Version: k.Version, Payload: b, Optional: k.Optional})
	}
	return ds, nil
}

// BumpDesired moves the desired-state generation of nodes (in node order, as the triggers do) and
// tells their gateways once tx commits: a module's part of the state changed.
func BumpDesired(ctx context.Context, tx pgx.Tx, nodeIDs ...string) error {
	if len(nodeIDs) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `WITH n AS (SELECT DISTINCT unnest($1::uuid[]) AS node_id),
		bumped AS (
		  INSERT INTO compute.node_desired AS d (node_id, generation) SELECT node_id, 2 FROM n ORDER BY node_id
		  ON CONFLICT (node_id) DO UPDATE SET generation = d.generation + 1, updated_at = compute.compute_now()
		  RETURNING node_id)
		SELECT pg_catalog.pg_notify($2, node_id::text) FROM bumped`, nodeIDs, DesiredChannel)
	if err != nil {
		return fmt.Errorf("nodes: bump the desired state of %d nodes: %w", len(nodeIDs), err)
	}
	return nil
}

// Applied is a node's account of the desired state it applied: the generation, and, when it
// acknowledged a state (Acked), the error it met ("" for none). A heartbeat tells the
// generation only: the error of the last acknowledgement stands until the next one.
type Applied struct {
	Node       string
	Generation int64
	Error      string
	Acked      bool
}

// RecordApplied records nodes' acknowledgements. An applied generation never moves back: an
// acknowledgement that arrives late changes only the error.
func RecordApplied(ctx context.Context, q postgres.Querier, acks []Applied) error {
	ids, gens, errs, set := make([]string, len(acks)), make([]int64, len(acks)), make([]string, len(acks)), make([]bool, len(acks))
	for i, a := range acks {
		ids[i], gens[i], errs[i], set[i] = a.Node, a.Generation, a.Error, a.Acked
	}
	_, err := q.Exec(ctx, `UPDATE compute.node_desired d SET applied_generation = greatest(d.applied_generation, u.g),
		  applied_error = CASE WHEN u.s THEN u.e ELSE d.applied_error END
		FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::bool[]) AS u(n, g, e, s) WHERE d.node_id = u.n`, ids, gens, errs, set)
	return err
}

// partOf is a module's part of a node's state; a module that panics fails the push of that
// node's state, not the gateway.
func partOf(ctx context.Context, k modules.DesiredKind, q postgres.Querier, nodeID string) (part any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return k.State(ctx, q, nodeID)
}
