package gateway

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/nodes"
)

// inventory turns a node's report into devices, node resources and atoms.
func (g *Gateway) inventory(ctx context.Context, node string, inv *agentv1.Inventory) error {
	in := capacity.Inventory{VCPUs: int(inv.GetVcpus()), MemoryGiB: int(inv.GetMemoryGib())}
	for _, d := range inv.GetGpus() {
		in.GPUs = append(in.GPUs, capacity.GPU{
			Index: int(d.GetIndex()), UUID: d.GetUuid(), Name: d.GetName(), MemoryMiB: d.GetMemoryMib(),
			PCIAddress: d.GetPciAddress(), NVLinkDomain: d.GetNvlinkDomain(), Health: d.GetHealth(),
		})
	}
	return g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		// The node's row before its rollup's, the order of every path (docs/capacity.md).
		if err := fleet.MergeFacts(ctx, tx, []string{node}, map[string]any{"gpuStatus": inv.GetGpuStatus()}); err != nil {
			return err
		}
		return capacity.SetInventory(ctx, tx, node, in)
	})
}

// criticalXIDs are the XID errors after which a GPU needs a reset before it is trusted again
// (NVIDIA's XID catalogue: double-bit ECC, row remapping, NVLink, fallen off the bus, contained
// and uncontained ECC, GSP).
var criticalXIDs = map[int32]bool{48: true, 63: true, 64: true, 74: true, 79: true, 92: true, 94: true, 95: true, 119: true, 120: true}

// health turns GPU events into device health that placement respects, and host pressure into the
// node's health.
func (g *Gateway) health(ctx context.Context, node string, h *agentv1.HealthReport) error {
	return g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		// The node's row before its rollup's, the order of every path (docs/capacity.md).
		if err := fleet.LockNodes(ctx, tx, []string{node}); err != nil {
			return err
		}
		for _, e := range h.GetGpuEvents() {
			health := ""
			switch {
			case e.GetKind() == "xid" && criticalXIDs[e.GetXid()], e.GetKind() == "ecc":
				health = api.HealthUnhealthy
			case e.GetKind() == "thermal", e.GetKind() == "xid":
				health = api.HealthDegraded
			default:
				continue
			}
			if err := capacity.SetGPUHealth(ctx, tx, node, int(e.GetIndex()), health); err != nil {
				return err
			}
			var tenant string
			if err := tx.QueryRow(ctx, `SELECT tenant_id FROM compute.nodes WHERE id = $1`, node).Scan(&tenant); err != nil {
				return err
			}
			if err := events.Emit(ctx, tx, "gpu.health", tenant, node, map[string]any{
				"gpu": e.GetIndex(), "uuid": e.GetUuid(), "kind": e.GetKind(), "xid": e.GetXid(), "detail": e.GetDetail(), "health": health,
			}); err != nil {
				return err
			}
			if health == api.HealthUnhealthy {
				// A GPU that needs a reset gets one, through the remediation workflow.
				reason := e.GetKind()
				if e.GetKind() == "xid" {
					reason = fmt.Sprintf("xid %d", e.GetXid())
				}
				if _, err := nodes.StartRemediation(ctx, tx, g.rt, tenant, node, int(e.GetIndex()), reason); err != nil {
					return err
				}
			}
		}
		if p := h.GetHost(); p != nil {
			return fleet.SetHealth(ctx, tx, []string{node}, pressureHealth(p))
		}
		return nil
	})
}

// pressureHealth: a host nearly out of memory or disk is degraded; one out of either is unhealthy.
func pressureHealth(p *agentv1.HostPressure) string {
	worst := max(p.GetMemoryUsed(), p.GetDiskUsed())
	switch {
	case worst >= 0.98:
		return api.HealthUnhealthy
	case worst >= 0.90:
		return api.HealthDegraded
	}
	return api.HealthHealthy
}
