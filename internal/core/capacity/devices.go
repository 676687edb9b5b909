package capacity

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/modules"
)

const deviceColumns = `id::text, node_id::text, index, uuid, model, name, memory_mib, nvlink_domain, health, mode, shares, updated_at`

func scanDevice(row pgx.Row) (api.Device, error) {
	var d api.Device
	err := row.Scan(&d.ID, &d.NodeID, &d.Index, &d.UUID, &d.Model, &d.Name, &d.MemoryMiB, &d.NVLinkDomain, &d.Health, &d.Mode, &d.Shares, &d.UpdatedAt)
	d.Holders = []api.DeviceHolder{}
	for _, p := range MIGProfiles(d.Model) {
		d.MIGProfiles = append(d.MIGProfiles, p.Profile)
	}
	return d, err
}

func registerDevices(r *modules.Registry) {
	modules.Handle(r, api.DevicesList,
		func(ctx context.Context, l modules.Lookup, in api.ListDevices) (modules.Target, error) {
			t := modules.Target{Existing: true, Kind: "node", Ref: in.Node, ResourceID: "*"}
			if !fleet.IsID(in.Node) {
				return t, api.InvalidField("node", "must be a node id")
			}
			err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.nodes WHERE id = $1`, in.Node).Scan(&t.TenantID)
			if errors.Is(err, pgx.ErrNoRows) {
				return t, api.NotFound("node", in.Node)
			}
			return t, err
		},
		func(ctx context.Context, c *modules.Call, in api.ListDevices) ([]api.Device, error) {
			rows, err := c.Tx.Query(ctx, `SELECT `+deviceColumns+` FROM compute.devices WHERE node_id = $1 ORDER BY index`, in.Node)
			if err != nil {
				return nil, err
			}
			out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (api.Device, error) { return scanDevice(row) })
			if err != nil {
				return nil, err
			}
			if out == nil {
				out = []api.Device{}
			}
			return out, loadHolders(ctx, c.Tx, in.Node, out)
		})

	modules.Handle(r, api.DevicesSetMode,
		func(ctx context.Context, l modules.Lookup, in api.SetGPUMode) (modules.Target, error) {
			t := modules.Target{Existing: true, Kind: "device", Ref: in.Device}
			// Only an id-shaped ref is cast to uuid: SQL does not promise to skip the cast in an OR.
			where, args := `d.uuid = $1`, []any{in.Device}
			if fleet.IsID(in.Device) {
				where, args = `d.uuid = $1 OR d.id = $2::uuid`, append(args, in.Device)
			}
			err := l.Q.QueryRow(ctx, `SELECT d.id::text, n.tenant_id FROM compute.devices d JOIN compute.nodes n ON n.id = d.node_id
				WHERE `+where, args...).Scan(&t.ResourceID, &t.TenantID)
			if errors.Is(err, pgx.ErrNoRows) {
				return t, api.NotFound("device", in.Device)
			}
			return t, err
		},
		func(ctx context.Context, c *modules.Call, in api.SetGPUMode) (api.Device, error) {
			return setGPUMode(ctx, c.Tx, c.Target.ResourceID, in)
		})
}

// setGPUMode changes a GPU's mode while nothing holds it, now or later. It takes the node's
// rollup row lock first, the lock every placer takes before reading a node, so no booking can
// land on the GPU between the check and the change.
func setGPUMode(ctx context.Context, tx pgx.Tx, deviceID string, in api.SetGPUMode) (api.Device, error) {
	var node, model string
	var index int
	if err := tx.QueryRow(ctx, `SELECT node_id::text, model, index FROM compute.devices WHERE id = $1`, deviceID).Scan(&node, &model, &index); err != nil {
		return api.Device{}, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM compute.node_capacity WHERE node_id = $1 FOR UPDATE`, node); err != nil {
		return api.Device{}, err
	}
	if in.Mode == api.GPUModeMIG && len(MIGProfiles(model)) == 0 {
		return api.Device{}, api.InvalidField("mode", "GPU model %q does not support MIG", model)
	}
	var holder string
	err := tx.QueryRow(ctx, `SELECT reservation_id::text FROM compute.bookings
		WHERE node_id = $1 AND resource = 'gpu' AND atoms && int4range($2, $3)
		  AND (upper_inf(during) OR upper(during) > compute.compute_now()) LIMIT 1`, node, GPUSpan(index).Lo, GPUSpan(index).Hi).Scan(&holder)
	if err == nil {
		return api.Device{}, &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("GPU %d of node %s is held by reservation %s, now or later; its mode changes only while nothing holds it", index, node, holder),
			Details: map[string]any{"reason": "gpu_held", "reservation": holder}}
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return api.Device{}, err
	}
	d, err := scanDevice(tx.QueryRow(ctx, `UPDATE compute.devices SET mode = $2, shares = $3, updated_at = compute.compute_now()
		WHERE id = $1 RETURNING `+deviceColumns, deviceID, in.Mode, in.Shares))
	if err != nil {
		return d, err
	}
	return d, refreshStamped(ctx, tx, node)
}
