package capacity

import (
	"slices"
	"sort"
	"time"

	"github.com/better-compute/compute/api"
)

// The placer is pure: it reads a snapshot of one node (its devices and the bookings that overlap
// the request's window) and returns the atoms to book. The database then referees the plan.

// GPUState is one GPU of a node snapshot.
type GPUState struct {
	Index   int
	UUID    string
	Model   string
	Domain  string // NVLink domain; empty: none
	Mode    string
	Shares  int
	Healthy bool // not unhealthy
}

// Held is a booked range of a node snapshot.
type Held struct {
	Resource    string // gpu, cpu, memory
	Span        Span
	Spot        bool
	Reservation string
	From        time.Time  // when the booking starts (calendar searches only)
	To          *time.Time // when it ends; nil: until released
}

// NodeSnapshot is what the placer knows of a node.
type NodeSnapshot struct {
	NodeID    string
	Name      string
	GPUs      []GPUState
	VCPUs     int
	MemoryGiB int
	Held      []Held
}

// Pick is one range to book.
type Pick struct {
	Resource string // gpu, cpu, memory
	Kind     string // gpu, mig, share, vcpu, memory
	Span     Span
	Model    string
	Units    float64
}

// MemberPlan is what one member books on one node.
type MemberPlan struct {
	NodeID string
	Picks  []Pick
	// Preempts lists the spot reservations whose bookings the picks overlap: a normal booking
	// ends them.
	Preempts []string
}

// Plan chooses atoms on n for shape. spot requests use only atoms free of every booking; normal
// requests may take atoms held by spot bookings, preferring those that are not. ok is false when
// the shape does not fit.
func Plan(n NodeSnapshot, shape api.Shape, spot bool) (plan MemberPlan, ok bool) {
	plan.NodeID = n.NodeID
	busy := func(resource string, s Span) (hard, soft bool) {
		for _, h := range n.Held {
			if h.Resource == resource && h.Span.Overlaps(s) {
				if h.Spot && !spot {
					soft = true
				} else {
					hard = true
				}
			}
		}
		return hard, soft
	}
	var picks []Pick
	switch {
	case shape.GPUs > 0:
		p, ok := planWholeGPUs(n, shape, busy)
		if !ok {
			return plan, false
		}
		picks = append(picks, p...)
	case shape.MIGProfile != "":
		p, ok := planMIG(n, shape, busy)
		if !ok {
			return plan, false
		}
		picks = append(picks, p)
	case shape.TimeSlice:
		p, ok := planShare(n, shape, busy)
		if !ok {
			return plan, false
		}
		picks = append(picks, p)
	}
	if shape.VCPUs > 0 {
		spans, ok := planUnits(n.VCPUs, shape.VCPUs, "cpu", busy)
		if !ok {
			return plan, false
		}
		for _, s := range spans {
			picks = append(picks, Pick{Resource: "cpu", Kind: "vcpu", Span: s, Units: float64(s.Len())})
		}
	}
	if shape.MemoryGiB > 0 {
		spans, ok := planUnits(n.MemoryGiB, shape.MemoryGiB, "memory", busy)
		if !ok {
			return plan, false
		}
		for _, s := range spans {
			picks = append(picks, Pick{Resource: "memory", Kind: "memory", Span: s, Units: float64(s.Len())})
		}
	}
	plan.Picks = picks
	if !spot {
		seen := map[string]bool{}
		for _, h := range n.Held {
			if !h.Spot || seen[h.Reservation] {
				continue
			}
			for _, p := range picks {
				if h.Resource == p.Resource && h.Span.Overlaps(p.Span) {
					seen[h.Reservation] = true
					plan.Preempts = append(plan.Preempts, h.Reservation)
					break
				}
			}
		}
		sort.Strings(plan.Preempts)
	}
	return plan, true
}

type busyFunc func(resource string, s Span) (hard, soft bool)

// planWholeGPUs packs: it takes the GPUs from the NVLink domain with the fewest free GPUs that
// still fits (so large free sets stay whole), and without an NVLink requirement falls back to the
// smallest domains first. GPUs held only by spot bookings are used last.
func planWholeGPUs(n NodeSnapshot, shape api.Shape, busy busyFunc) ([]Pick, bool) {
	type cand struct {
		gpu  GPUState
		soft bool
	}
	domains := map[string][]cand{}
	var order []string
	for _, g := range n.GPUs {
		if g.Mode != api.GPUModeWhole || !g.Healthy || (shape.Model != "" && g.Model != shape.Model) {
			continue
		}
		hard, soft := busy("gpu", GPUSpan(g.Index))
		if hard {
			continue
		}
		d := g.Domain
		if d == "" {
			d = "\x00" + g.UUID // no NVLink: a domain of one
		}
		if _, ok := domains[d]; !ok {
			order = append(order, d)
		}
		domains[d] = append(domains[d], cand{g, soft})
	}
	for _, d := range order {
		slices.SortStableFunc(domains[d], func(a, b cand) int {
			if a.soft != b.soft {
				if a.soft {
					return 1
				}
				return -1
			}
			return a.gpu.Index - b.gpu.Index
		})
	}
	// Domains by how many free GPUs they have, fewest first (best fit), then by name.
	sort.SliceStable(order, func(i, j int) bool {
		if len(domains[order[i]]) != len(domains[order[j]]) {
			return len(domains[order[i]]) < len(domains[order[j]])
		}
		return order[i] < order[j]
	})
	var chosen []GPUState
	for _, d := range order {
		if len(domains[d]) >= shape.GPUs {
			for _, c := range domains[d][:shape.GPUs] {
				chosen = append(chosen, c.gpu)
			}
			break
		}
	}
	if chosen == nil {
		if shape.NVLink && shape.GPUs > 1 {
			return nil, false
		}
		for _, d := range order {
			for _, c := range domains[d] {
				if len(chosen) < shape.GPUs {
					chosen = append(chosen, c.gpu)
				}
			}
		}
		if len(chosen) < shape.GPUs {
			return nil, false
		}
	}
	slices.SortFunc(chosen, func(a, b GPUState) int { return a.Index - b.Index })
	// Adjacent GPUs of one model become one booking row.
	var picks []Pick
	for _, g := range chosen {
		s := GPUSpan(g.Index)
		if k := len(picks) - 1; k >= 0 && picks[k].Span.Hi == s.Lo && picks[k].Model == g.Model {
			picks[k].Span.Hi = s.Hi
			picks[k].Units++
			continue
		}
		picks = append(picks, Pick{Resource: "gpu", Kind: "gpu", Span: s, Model: g.Model, Units: 1})
	}
	return picks, true
}

// planMIG places one MIG slice: on the MIG-mode GPU of the model with the fewest free memory
// slices that has a free placement for the profile, at its lowest free start.
func planMIG(n NodeSnapshot, shape api.Shape, busy busyFunc) (Pick, bool) {
	prof, ok := MIGProfile(shape.Model, shape.MIGProfile)
	if !ok {
		return Pick{}, false
	}
	best, bestFree := Pick{}, -1
	for _, g := range n.GPUs {
		if g.Mode != api.GPUModeMIG || !g.Healthy || g.Model != shape.Model {
			continue
		}
		free := 0
		for k := range MIGSlices {
			if hard, _ := busy("gpu", MIGSpan(g.Index, k, 1)); !hard {
				free++
			}
		}
		for _, start := range prof.Starts {
			s := MIGSpan(g.Index, start, prof.Size)
			if hard, _ := busy("gpu", s); hard {
				continue
			}
			if bestFree < 0 || free < bestFree {
				best = Pick{Resource: "gpu", Kind: "mig", Span: s, Model: g.Model, Units: float64(prof.Size) / MIGSlices}
				bestFree = free
			}
			break
		}
	}
	return best, bestFree >= 0
}

// planShare takes one time-slice share, on the time-sliced GPU of the model with the fewest free
// shares (packing shares onto already shared GPUs).
func planShare(n NodeSnapshot, shape api.Shape, busy busyFunc) (Pick, bool) {
	best, bestFree := Pick{}, -1
	for _, g := range n.GPUs {
		if g.Mode != api.GPUModeTimeSlice || !g.Healthy || g.Model != shape.Model {
			continue
		}
		free, first := 0, -1
		for i := range g.Shares {
			if hard, _ := busy("gpu", ShareSpan(g.Index, i)); !hard {
				free++
				if first < 0 {
					first = i
				}
			}
		}
		if first >= 0 && (bestFree < 0 || free < bestFree) {
			best = Pick{Resource: "gpu", Kind: "share", Span: ShareSpan(g.Index, first), Model: g.Model, Units: 1 / float64(g.Shares)}
			bestFree = free
		}
	}
	return best, bestFree >= 0
}

// planUnits takes want atoms of a counted resource (vCPUs, GiB) out of [0, total): one free run
// that fits best, or else the longest runs first, so that few rows hold it.
func planUnits(total, want int, resource string, busy busyFunc) ([]Span, bool) {
	var taken, runs []Span
	start := -1
	for i := 0; i <= total; i++ {
		free := i < total
		if free {
			hard, _ := busy(resource, Span{i, i + 1})
			free = !hard
		}
		switch {
		case free && start < 0:
			start = i
		case !free && start >= 0:
			runs = append(runs, Span{start, i})
			start = -1
		}
	}
	best := -1
	for i, r := range runs {
		if r.Len() >= want && (best < 0 || r.Len() < runs[best].Len()) {
			best = i
		}
	}
	if best >= 0 {
		return []Span{{runs[best].Lo, runs[best].Lo + want}}, true
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Len() > runs[j].Len() })
	left := want
	for _, r := range runs {
		if left == 0 {
			break
		}
		take := min(left, r.Len())
		taken = append(taken, Span{r.Lo, r.Lo + take})
		left -= take
	}
	if left > 0 {
		return nil, false
	}
	sort.Slice(taken, func(i, j int) bool { return taken[i].Lo < taken[j].Lo })
	return taken, true
}
