package capacity

import (
	"context"
	"fmt"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres"
)

// GPU is a GPU as a node reports it.
type GPU struct {
	Index        int
	UUID         string
	Name         string // e.g. "NVIDIA H100 80GB HBM3"
	MemoryMiB    int64
	PCIAddress   string
	NVLinkDomain string // GPUs that share an NVLink domain (an NVSwitch fabric or a bridge)
	Health       string // api.Health*; empty means healthy
}

// Inventory is what a node can offer.
type Inventory struct {
	GPUs      []GPU
	VCPUs     int
	MemoryGiB int
}

// The largest inventory a node may report, as the schema's checks allow.
const (
	maxVCPUs     = 65536
	maxMemoryGiB = 1 << 20
	maxGPUIndex  = 255
)

// Validate checks an inventory: unique indexes and UUIDs, sane numbers.
func (inv Inventory) Validate() error {
	if inv.VCPUs < 0 || inv.VCPUs > maxVCPUs || inv.MemoryGiB < 0 || inv.MemoryGiB > maxMemoryGiB {
		return fmt.Errorf("capacity: inventory of %d vCPUs and %d GiB is out of range", inv.VCPUs, inv.MemoryGiB)
	}
	idx, ids := map[int]bool{}, map[string]bool{}
	for _, g := range inv.GPUs {
		switch {
		case g.Index < 0 || g.Index > maxGPUIndex:
			return fmt.Errorf("capacity: GPU index %d is out of range", g.Index)
		case idx[g.Index]:
			return fmt.Errorf("capacity: two GPUs have index %d", g.Index)
		case g.UUID == "" || ids[g.UUID]:
			return fmt.Errorf("capacity: GPU %d has an empty or repeated UUID %q", g.Index, g.UUID)
		case g.Name == "":
			return fmt.Errorf("capacity: GPU %d has no name", g.Index)
		}
		switch g.Health {
		case "", api.HealthHealthy, api.HealthDegraded, api.HealthUnhealthy, api.HealthUnknown:
		default:
			return fmt.Errorf("capacity: GPU %d health %q is not a health", g.Index, g.Health)
		}
		idx[g.Index], ids[g.UUID] = true, true
	}
	return nil
}

// SetInventory makes a node's devices and resources what inv says, in the caller's transaction,
// and refreshes the node's rollup. A GPU that is gone but still booked stays, marked unhealthy, so
// that its holder's booking keeps meaning something; an unbooked one is removed. A GPU's mode is
// kept: the node reports hardware, the API decides modes.
func SetInventory(ctx context.Context, q postgres.Querier, nodeID string, inv Inventory) error {
	if err := inv.Validate(); err != nil {
		return err
	}
	// The node's rollup row first, as every writer of its devices takes it (setGPUMode, placers
	// reading them): devices changed before it would invert the lock order.
	if _, err := q.Exec(ctx, lockSQL, []string{nodeID}); err != nil {
		return fmt.Errorf("capacity: inventory: %w", err)
	}
	indexes := make([]int32, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		health := g.Health
		if health == "" {
			health = api.HealthHealthy
		}
		_, err := q.Exec(ctx, `INSERT INTO compute.devices (id, node_id, index, uuid, name, model, memory_mib, pci_address, nvlink_domain, health)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (node_id, index) DO UPDATE SET uuid = excluded.uuid, name = excluded.name, model = excluded.model,
			  memory_mib = excluded.memory_mib, pci_address = excluded.pci_address, nvlink_domain = excluded.nvlink_domain,
			  health = excluded.health, updated_at = compute.compute_now()`,
			fleet.NewID(), nodeID, g.Index, g.UUID, g.Name, ModelKey(g.Name, g.MemoryMiB), g.MemoryMiB, g.PCIAddress, g.NVLinkDomain, health)
		if postgres.ErrorCode(err) == postgres.UniqueViolation {
			return fmt.Errorf("capacity: GPU %s is already registered on another node", g.UUID)
		}
		if err != nil {
			return fmt.Errorf("capacity: inventory: %w", err)
		}
		indexes = append(indexes, int32(g.Index))
	}
	_, err := q.Exec(ctx, `WITH gone AS (
		  SELECT d.id, EXISTS (SELECT 1 FROM compute.bookings b WHERE b.node_id = d.node_id AND b.resource = 'gpu'
		      AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)
		      AND (upper_inf(b.during) OR upper(b.during) > compute.compute_now())) AS booked
		  FROM compute.devices d WHERE d.node_id = $1 AND NOT d.index = ANY($2)
		), unhealthy AS (
		  UPDATE compute.devices SET health = 'unhealthy', updated_at = compute.compute_now()
		  WHERE id IN (SELECT id FROM gone WHERE booked)
		)
		DELETE FROM compute.devices WHERE id IN (SELECT id FROM gone WHERE NOT booked)`, nodeID, indexes)
	if err != nil {
		return fmt.Errorf("capacity: inventory: remove lost GPUs: %w", err)
	}
	_, err = q.Exec(ctx, `INSERT INTO compute.node_resources (node_id, vcpus, memory_gib) VALUES ($1, $2, $3)
		ON CONFLICT (node_id) DO UPDATE SET vcpus = excluded.vcpus, memory_gib = excluded.memory_gib, updated_at = compute.compute_now()`,
		nodeID, inv.VCPUs, inv.MemoryGiB)
	if err != nil {
		return fmt.Errorf("capacity: inventory: %w", err)
	}
	return refreshStamped(ctx, q, nodeID)
}

// SetGPUHealth changes one GPU's health (the gateway reports XIDs, ECC and thermal events through
// it) and refreshes the node's rollup.
func SetGPUHealth(ctx context.Context, q postgres.Querier, nodeID string, index int, health string) error {
	if _, err := q.Exec(ctx, lockSQL, []string{nodeID}); err != nil {
		return fmt.Errorf("capacity: GPU health: %w", err)
	}
	tag, err := q.Exec(ctx, `UPDATE compute.devices SET health = $3, updated_at = compute.compute_now()
		WHERE node_id = $1 AND index = $2 AND health <> $3`, nodeID, index, health)
	if err != nil {
		return fmt.Errorf("capacity: GPU health: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	return refreshStamped(ctx, q, nodeID)
}
