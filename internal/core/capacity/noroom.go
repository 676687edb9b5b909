package capacity

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// Why a request found no room: the reason in a no-room conflict's details. The diagnosis runs
// only after placement has failed, so it never slows a placement that succeeds.
const (
	NoRoomNoNodes       = "no_nodes"            // the pool has fewer (non-retired) nodes than members
	NoRoomLabels        = "labels"              // too few nodes have the labels asked for
	NoRoomModel         = "model"               // too few nodes have GPUs of the model
	NoRoomTooLarge      = "too_large"           // no node is large enough, even empty
	NoRoomGPUMode       = "gpu_mode"            // the GPUs that would fit are in another mode
	NoRoomUnhealthyGPUs = "unhealthy_gpus"      // the GPUs that would fit are unhealthy
	NoRoomUnschedulable = "nodes_unschedulable" // the nodes that would fit are offline, unhealthy, cordoned or draining
	NoRoomBooked        = "booked"              // what fits is held by other bookings at the start of the window
	NoRoomFutureBooking = "future_booking"      // free at the start, but a booking later in the window is in the way
	NoRoomContended     = "contended"           // it fits, but concurrent requests took it first
)

// diagnoseLimit bounds how many nodes the booking stage of a diagnosis reads the bookings of.
const diagnoseLimit = 256

// noCapacity is the conflict error of a request that does not fit: it names the cause (see the
// NoRoom reasons), when the room is free where a booking is in the way, and what the pool has
// free now for the shape.
func (r request) noCapacity(ctx context.Context, q postgres.Querier, member int) error {
	var nodes, freeGPUs, largest, freeVCPUs, freeMem int
	err := q.QueryRow(ctx, `SELECT count(*) FILTER (WHERE n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy'),
		  coalesce(sum(nc.gpus_free + CASE WHEN $3 THEN 0 ELSE nc.gpus_spot END) FILTER (WHERE n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy' AND ($2 = '' OR nc.gpu_model IN ($2, 'mixed'))), 0),
		  coalesce(max(nc.gpus_free + CASE WHEN $3 THEN 0 ELSE nc.gpus_spot END) FILTER (WHERE n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy' AND ($2 = '' OR nc.gpu_model IN ($2, 'mixed'))), 0),
		  coalesce(sum(nc.vcpus_total - nc.vcpus_used) FILTER (WHERE n.state = 'active' AND n.status = 'online'), 0),
		  coalesce(sum(nc.memory_total - nc.memory_used) FILTER (WHERE n.state = 'active' AND n.status = 'online'), 0)
		FROM compute.node_capacity nc JOIN compute.nodes n ON n.id = nc.node_id WHERE nc.pool_id = $1`,
		r.pool, r.in.Model, r.in.Spot).Scan(&nodes, &freeGPUs, &largest, &freeVCPUs, &freeMem)
	if err != nil {
		return err
	}
	d, err := r.diagnose(ctx, q)
	if err != nil {
		return err
	}
	what := describeShape(r.in.Shape)
	msg := fmt.Sprintf("pool %s has no room for %s", r.in.Pool, what)
	if m := r.in.MemberCount(); m > 1 {
		msg = fmt.Sprintf("pool %s has room for %d of %d members of %s", r.in.Pool, member, m, what)
	}
	details := map[string]any{
		"reason": d.reason, "schedulableNodes": nodes, "freeGPUs": freeGPUs, "largestFreeBlock": largest,
		"freeVCPUs": freeVCPUs, "freeMemoryGiB": freeMem, "membersPlaced": member,
	}
	for k, v := range d.details {
		details[k] = v
	}
	msg += ": " + d.why
	switch d.reason {
	case NoRoomBooked, NoRoomFutureBooking, NoRoomContended:
		if !r.w.start.After(r.now) {
			msg += fmt.Sprintf(". Free now: %d schedulable nodes, %d GPUs (at most %d on one node), %d vCPUs, %d GiB", nodes, freeGPUs, largest, freeVCPUs, freeMem)
		}
	}
	return &api.Error{Code: api.CodeConflict, Message: msg, Details: details}
}

// diagnosis is the cause of a failed placement.
type diagnosis struct {
	reason  string
	why     string // a sentence for the message
	details map[string]any
}

// diagNode is a node of the pool as the diagnosis sees it.
type diagNode struct {
	snap                  NodeSnapshot
	state, status, health string
	labelsOK              bool
}

// diagnose finds the first reason, in the order below, that leaves fewer nodes than the request
// has members: each stage keeps the nodes that pass it.
func (r request) diagnose(ctx context.Context, q postgres.Querier) (diagnosis, error) {
	need := r.in.MemberCount()
	all, err := r.diagNodes(ctx, q)
	if err != nil {
		return diagnosis{}, err
	}
	shape := r.in.Shape
	gpuKind := shapeKind(shape) != ""
	model := shape.Model
	ofModel := func(g GPUState) bool { return model == "" || g.Model == model }
	short := func(have int, what string) string {
		if have == 0 {
			return "no node " + what
		}
		return fmt.Sprintf("only %d nodes %s, and the request needs %d", have, what, need)
	}
	counts := map[string]any{"nodes": len(all)}
	if len(all) < need {
		return diagnosis{NoRoomNoNodes, short(len(all), "is in the pool"), counts}, nil
	}

	var labelled []diagNode
	for _, n := range all {
		if n.labelsOK {
			labelled = append(labelled, n)
		}
	}
	counts["matchingLabels"] = len(labelled)
	if len(labelled) < need {
		return diagnosis{NoRoomLabels, short(len(labelled), "has the labels asked for"+describeLabels(r.in.RequireLabels, r.in.AvoidLabels)), counts}, nil
	}

	withModel := labelled
	if gpuKind {
		withModel = nil
		models := map[string]bool{}
		for _, n := range labelled {
			has := false
			for _, g := range n.snap.GPUs {
				models[g.Model] = true
				has = has || ofModel(g)
			}
			if has {
				withModel = append(withModel, n)
			}
		}
		counts["withModel"] = len(withModel)
		if len(withModel) < need {
			present := sortedKeys(models)
			why := short(len(withModel), "has "+gpusOf(model))
			if len(present) > 0 {
				why += " (the nodes have " + strings.Join(present, ", ") + ")"
			}
			counts["models"] = present
			return diagnosis{NoRoomModel, why, counts}, nil
		}
	}

	// Large enough when empty, were every GPU of the model healthy and in the mode asked for.
	want := wantMode(shape)
	var large []diagNode
	maxGPUs, maxVCPUs, maxMem := 0, 0, 0
	for _, n := range withModel {
		ideal := n.snap
		ideal.GPUs = nil
		count := 0
		for _, g := range n.snap.GPUs {
			if ofModel(g) {
				count++
				g.Mode, g.Healthy = want, true
				if want == api.GPUModeTimeSlice {
					g.Shares = max(g.Shares, 2)
				}
			}
			ideal.GPUs = append(ideal.GPUs, g)
		}
		maxGPUs, maxVCPUs, maxMem = max(maxGPUs, count), max(maxVCPUs, n.snap.VCPUs), max(maxMem, n.snap.MemoryGiB)
		if _, ok := Plan(ideal, shape, true); ok {
			large = append(large, n)
		}
	}
	counts["largeEnough"] = len(large)
	if len(large) < need {
		counts["maxGPUs"], counts["maxVCPUs"], counts["maxMemoryGiB"] = maxGPUs, maxVCPUs, maxMem
		why := short(len(large), "is large enough, even empty") +
			fmt.Sprintf(": the largest have %d %s, %d vCPUs and %d GiB", maxGPUs, gpusOf(model), maxVCPUs, maxMem)
		if shape.NVLink {
			why += " (NVLink asks for all of a member's GPUs in one domain)"
		}
		return diagnosis{NoRoomTooLarge, why, counts}, nil
	}

	// In the right mode, were every GPU healthy.
	var moded []diagNode
	modes := map[string]int{}
	for _, n := range large {
		healthy := n.snap
		healthy.GPUs = nil
		for _, g := range n.snap.GPUs {
			if ofModel(g) {
				modes[g.Mode]++
			}
			g.Healthy = true
			healthy.GPUs = append(healthy.GPUs, g)
		}
		if _, ok := Plan(healthy, shape, true); ok {
			moded = append(moded, n)
		}
	}
	if len(moded) < need {
		counts["modes"], counts["wantMode"] = modes, want
		var in []string
		for _, m := range sortedKeys(boolKeys(modes)) {
			in = append(in, fmt.Sprintf("%d in %s mode", modes[m], m))
		}
		why := fmt.Sprintf("%s: the %s of the nodes large enough are %s, and the request needs %s mode (devices.setMode changes a GPU's mode while nothing holds it)",
			short(len(moded), "has its GPUs in "+want+" mode"), gpusOf(model), strings.Join(in, ", "), want)
		return diagnosis{NoRoomGPUMode, why, counts}, nil
	}

	var healthy []diagNode
	for _, n := range moded {
		if _, ok := Plan(n.snap, shape, true); ok {
			healthy = append(healthy, n)
		}
	}
	if len(healthy) < need {
		return diagnosis{NoRoomUnhealthyGPUs, short(len(healthy), "that would fit has enough healthy GPUs"), counts}, nil
	}

	var sched []diagNode
	states := map[string]int{"offline": 0, "unhealthy": 0, "cordoned": 0, "draining": 0}
	for _, n := range healthy {
		switch {
		case n.state != api.NodeActive:
			states[n.state]++
		case n.status != "online":
			states["offline"]++
		case n.health == "unhealthy":
			states["unhealthy"]++
		default:
			sched = append(sched, n)
		}
	}
	counts["schedulableThatFit"] = len(sched)
	if len(sched) < need {
		for k, v := range states {
			counts[k] = v
		}
		why := fmt.Sprintf("%s: of the nodes that would fit, %d are offline, %d unhealthy, %d cordoned and %d draining",
			short(len(sched), "that would fit is schedulable"), states["offline"], states["unhealthy"], states["cordoned"], states["draining"])
		return diagnosis{NoRoomUnschedulable, why, counts}, nil
	}
	return r.diagnoseBookings(ctx, q, sched, counts)
}

// diagnoseBookings explains a request that fits the hardware of enough schedulable nodes: the
// bookings are in the way, now or later in the window, and it says from when there is room.
func (r request) diagnoseBookings(ctx context.Context, q postgres.Querier, sched []diagNode, counts map[string]any) (diagnosis, error) {
	need := r.in.MemberCount()
	if len(sched) > diagnoseLimit {
		sched = sched[:diagnoseLimit]
	}
	snaps := make([]NodeSnapshot, len(sched))
	ids := make([]string, len(sched))
	index := map[string]int{}
	for i, n := range sched {
		snaps[i], ids[i], index[n.snap.NodeID] = n.snap, n.snap.NodeID, i
	}
	rows, err := q.Query(ctx, `SELECT node_id::text, resource, lower(atoms), upper(atoms), spot, reservation_id::text, lower(during), upper(during)
		FROM compute.bookings WHERE node_id = ANY($1::uuid[]) AND during && tstzrange($2, NULL, '[)')`, ids, r.w.start)
	if err != nil {
		return diagnosis{}, err
	}
	var node string
	var h Held
	if _, err := pgx.ForEachRow(rows, []any{&node, &h.Resource, &h.Span.Lo, &h.Span.Hi, &h.Spot, &h.Reservation, &h.From, &h.To}, func() error {
		if i, ok := index[node]; ok {
			snaps[i].Held = append(snaps[i].Held, h)
		}
		return nil
	}); err != nil {
		return diagnosis{}, err
	}
	length := time.Duration(0) // until released
	if r.w.end != nil {
		length = r.w.end.Sub(r.w.start)
	}
	start := r.w.start
	fits := func(n NodeSnapshot, from time.Time, to *time.Time) bool {
		_, ok := Plan(during(n, from, endOr(to)), r.in.Shape, r.in.Spot)
		return ok
	}
	atStart, overWindow := 0, 0
	var blockedAt *time.Time
	for _, n := range snaps {
		if fits(n, start, r.w.end) {
			overWindow++
			continue
		}
		instant := start.Add(time.Microsecond)
		if !fits(n, start, &instant) {
			continue
		}
		atStart++
		if t := firstBlock(n, start, r.w.end, fits); t != nil && (blockedAt == nil || t.Before(*blockedAt)) {
			blockedAt = t
		}
	}
	counts["fitOverWindow"], counts["fitAtStart"] = overWindow, atStart
	if overWindow >= need {
		return diagnosis{NoRoomContended, "concurrent requests took the nodes that fit first; try again", counts}, nil
	}
	freeAt, found := earliestFit(snaps, need, length, start, start.Add(HorizonDefault), fits)
	var when string
	if found {
		counts["freeAt"] = freeAt
		when = "; it is free from " + freeAt.Format(time.RFC3339)
	} else {
		when = fmt.Sprintf("; it is not free within %d days (reservations.availability looks further)", int(HorizonDefault.Hours()/24))
	}
	if r.in.Spot {
		when += " (a spot request never displaces a booking, spot or not)"
	}
	if overWindow+atStart >= need && blockedAt != nil {
		counts["bookedFrom"] = *blockedAt
		return diagnosis{NoRoomFutureBooking, fmt.Sprintf("it is free at the start, but a booking from %s is in the way%s",
			blockedAt.Format(time.RFC3339), when), counts}, nil
	}
	return diagnosis{NoRoomBooked, "what would fit is held by other reservations" + when, counts}, nil
}

// firstBlock is the start of the first booking of n, after from and before to, from which the
// shape no longer fits on n.
func firstBlock(n NodeSnapshot, from time.Time, to *time.Time, fits func(NodeSnapshot, time.Time, *time.Time) bool) *time.Time {
	var starts []time.Time
	for _, h := range n.Held {
		if h.From.After(from) && (to == nil || h.From.Before(*to)) {
			starts = append(starts, h.From)
		}
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	for _, s := range starts {
		end := s.Add(time.Microsecond)
		if !fits(n, from, &end) {
			return &s
		}
	}
	return nil
}

// earliestFit is the earliest start at or after after, up to horizon, from which need nodes
// each fit for length (0: until released). A window opens only when a booking ends.
func earliestFit(snaps []NodeSnapshot, need int, length time.Duration, after, horizon time.Time, fits func(NodeSnapshot, time.Time, *time.Time) bool) (time.Time, bool) {
	for _, t := range windowStarts(snaps, after, horizon) {
		var end *time.Time
		if length > 0 {
			e := t.Add(length)
			end = &e
		}
		n := 0
		for _, s := range snaps {
			if fits(s, t, end) {
				n++
			}
		}
		if n >= need {
			return t, true
		}
	}
	return time.Time{}, false
}

// diagNodes reads the pool's nodes that are not retired, with their GPUs and resources and
// whether they match the request's labels.
func (r request) diagNodes(ctx context.Context, q postgres.Querier) ([]diagNode, error) {
	rows, err := q.Query(ctx, `SELECT n.id::text, n.name, n.state, n.status, n.health,
		  n.labels @> $2 AND NOT EXISTS (SELECT 1 FROM jsonb_each_text($3) a WHERE n.labels ->> a.key = a.value),
		  coalesce(r.vcpus, 0), coalesce(r.memory_gib, 0)
		FROM compute.nodes n LEFT JOIN compute.node_resources r ON r.node_id = n.id
		WHERE n.pool_id = $1 AND n.state <> 'retired' ORDER BY n.id`, r.pool, labelsOrEmpty(r.in.RequireLabels), labelsOrEmpty(r.in.AvoidLabels))
	if err != nil {
		return nil, err
	}
	var out []diagNode
	index := map[string]int{}
	var n diagNode
	if _, err := pgx.ForEachRow(rows, []any{&n.snap.NodeID, &n.snap.Name, &n.state, &n.status, &n.health, &n.labelsOK, &n.snap.VCPUs, &n.snap.MemoryGiB}, func() error {
		index[n.snap.NodeID] = len(out)
		out = append(out, n)
		return nil
	}); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, `SELECT d.node_id::text, d.index, d.uuid, d.model, d.nvlink_domain, d.mode, d.shares, d.health <> 'unhealthy'
		FROM compute.devices d JOIN compute.nodes n ON n.id = d.node_id WHERE n.pool_id = $1 AND n.state <> 'retired' ORDER BY d.node_id, d.index`, r.pool)
	if err != nil {
		return nil, err
	}
	var node string
	var g GPUState
	_, err = pgx.ForEachRow(rows, []any{&node, &g.Index, &g.UUID, &g.Model, &g.Domain, &g.Mode, &g.Shares, &g.Healthy}, func() error {
		if i, ok := index[node]; ok {
			out[i].snap.GPUs = append(out[i].snap.GPUs, g)
		}
		return nil
	})
	return out, err
}

func wantMode(s api.Shape) string {
	switch {
	case s.MIGProfile != "":
		return api.GPUModeMIG
	case s.TimeSlice:
		return api.GPUModeTimeSlice
	}
	return api.GPUModeWhole
}

// gpusOf names the GPUs of a model, or of any when it is empty: "h100 GPUs", "GPUs" (it was
// "any GPUs").
func gpusOf(model string) string {
	if model == "" {
		return "GPUs"
	}
	return model + " GPUs"
}

func describeLabels(require, avoid map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(boolKeys(require)) {
		parts = append(parts, k+"="+require[k])
	}
	s := ""
	if len(parts) > 0 {
		s = " (" + strings.Join(parts, ", ")
	}
	parts = nil
	for _, k := range sortedKeys(boolKeys(avoid)) {
		parts = append(parts, k+"="+avoid[k])
	}
	if len(parts) > 0 {
		if s == "" {
			s = " ("
		} else {
			s += "; "
		}
		s += "none of " + strings.Join(parts, ", ")
	}
	if s != "" {
		s += ")"
	}
	return s
}

func boolKeys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}
