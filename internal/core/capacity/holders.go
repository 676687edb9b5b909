package capacity

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// onNodeSQL is the reservations.list filter on a node ($6, an id or a name): the reservation has
// a booking on it, or ended because it was drained. Ids and names are compared as text, so no
// string is ever cast to uuid.
const onNodeSQL = `(EXISTS (SELECT 1 FROM compute.bookings b JOIN compute.nodes n ON n.id = b.node_id
	    WHERE b.reservation_id = compute.reservations.id AND (n.id::text = $6 OR n.name = $6))
	  OR end_reason = 'drained' AND EXISTS (SELECT 1 FROM compute.nodes n
	    WHERE n.id::text = compute.reservations.ended_by AND (n.id::text = $6 OR n.name = $6)))`

// loadHolders fills the holders of a node's GPUs: every GPU booking that has not ended, with the
// part of its atoms on each GPU.
func loadHolders(ctx context.Context, q postgres.Querier, node string, devices []api.Device) error {
	rows, err := q.Query(ctx, `SELECT d.index, b.reservation_id::text, r.tenant_id, r.state, b.kind,
		  lower(b.atoms * int4range(d.index * 64, d.index * 64 + 64)), upper(b.atoms * int4range(d.index * 64, d.index * 64 + 64)),
		  b.spot, lower(b.during), upper(b.during)
		FROM compute.devices d
		JOIN compute.bookings b ON b.node_id = d.node_id AND b.resource = 'gpu' AND b.atoms && int4range(d.index * 64, d.index * 64 + 64)
		JOIN compute.reservations r ON r.id = b.reservation_id
		WHERE d.node_id = $1 AND (upper_inf(b.during) OR upper(b.during) > compute.compute_now())
		ORDER BY d.index, lower(b.during), lower(b.atoms)`, node)
	if err != nil {
		return err
	}
	byIndex := map[int]int{}
	for i, d := range devices {
		byIndex[d.Index] = i
	}
	var index, lo, hi int
	var h api.DeviceHolder
	var until *time.Time
	_, err = pgx.ForEachRow(rows, []any{&index, &h.Reservation, &h.TenantID, &h.State, &h.Kind, &lo, &hi, &h.Spot, &h.From, &until}, func() error {
		h.Atoms = fmt.Sprintf("[%d,%d)", lo, hi)
		h.Until = until
		if i, ok := byIndex[index]; ok {
			devices[i].Holders = append(devices[i].Holders, h)
		}
		return nil
	})
	return err
}

// markDrained records that reservations ended because a node was drained: after the transaction
// that ended them (released or cancelled) set the reason from their state.
func markDrained(ctx context.Context, q postgres.Querier, ids []string, node string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, `UPDATE compute.reservations SET end_reason = 'drained', ended_by = $2 WHERE id = ANY($1::uuid[])`, ids, node)
	return err
}
