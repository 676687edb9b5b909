package capacity

import (
	"regexp"
	"strings"
)

// Atom layout of a GPU (see the migration's header): 64 positions, MIG memory slices of 8.
const (
	PositionsPerGPU = 64
	MIGSliceWidth   = 8
	MIGSlices       = PositionsPerGPU / MIGSliceWidth
)

// Span is a half-open range of atoms [Lo, Hi).
type Span struct{ Lo, Hi int }

// Len is the number of atoms in s.
func (s Span) Len() int { return s.Hi - s.Lo }

// Overlaps reports whether s and o share an atom.
func (s Span) Overlaps(o Span) bool { return s.Lo < o.Hi && o.Lo < s.Hi }

// GPUSpan is the whole of GPU index.
func GPUSpan(index int) Span { return Span{index * PositionsPerGPU, (index + 1) * PositionsPerGPU} }

// MIGSpan is the MIG slice of GPU index that starts at memory slice start and is size slices wide.
func MIGSpan(index, start, size int) Span {
	base := index * PositionsPerGPU
	return Span{base + start*MIGSliceWidth, base + (start+size)*MIGSliceWidth}
}

// ShareSpan is time-slice share i of GPU index.
func ShareSpan(index, share int) Span {
	base := index * PositionsPerGPU
	return Span{base + share, base + share + 1}
}

// MIGPlacement is where a MIG profile may sit on a GPU: at any of Starts, Size memory slices wide.
type MIGPlacement struct {
	Profile string
	Size    int
	Starts  []int
}

// The MIG layout shared by the A100, H100 and H200 (NVIDIA's MIG user guide, "supported
// profiles"): seven compute slices over eight memory slices. The profiles' names differ by
// memory size; their placements are the same.
func migLayout(mem [5]string) []MIGPlacement {
	return []MIGPlacement{
		{mem[0], 1, []int{0, 1, 2, 3, 4, 5, 6}}, // 1g
		{mem[1], 2, []int{0, 2, 4, 6}},          // 1g with twice the memory
		{"2" + mem[2], 2, []int{0, 2, 4}},       // 2g
		{"3" + mem[3], 4, []int{0, 4}},          // 3g
		{"4" + mem[3], 4, []int{0}},             // 4g
		{"7" + mem[4], 8, []int{0}},             // 7g: the whole GPU in MIG mode
	}
}

// migProfiles lists the MIG profiles of each model key that supports MIG.
var migProfiles = map[string][]MIGPlacement{
	"a100-40gb": migLayout([5]string{"1g.5gb", "1g.10gb", "g.10gb", "g.20gb", "g.40gb"}),
	"a100":      migLayout([5]string{"1g.10gb", "1g.20gb", "g.20gb", "g.40gb", "g.80gb"}),
	"h100":      migLayout([5]string{"1g.10gb", "1g.20gb", "g.20gb", "g.40gb", "g.80gb"}),
	"h100-94gb": migLayout([5]string{"1g.12gb", "1g.24gb", "g.24gb", "g.47gb", "g.94gb"}),
	"h200":      migLayout([5]string{"1g.18gb", "1g.35gb", "g.35gb", "g.71gb", "g.141gb"}),
	"gh200":     migLayout([5]string{"1g.12gb", "1g.24gb", "g.24gb", "g.48gb", "g.96gb"}),
	"b200":      migLayout([5]string{"1g.23gb", "1g.45gb", "g.45gb", "g.90gb", "g.180gb"}),
	// The A30 has four memory slices: its starts are NVML's placements (which the node is sent),
	// over the first half of the GPU's positions.
	"a30": {{"1g.6gb", 1, []int{0, 1, 2, 3}}, {"2g.12gb", 2, []int{0, 2}}, {"4g.24gb", 4, []int{0}}},
}

// MIGProfiles returns the MIG placements of a model key; nil when the model has no MIG.
func MIGProfiles(model string) []MIGPlacement { return migProfiles[model] }

// MIGProfile returns the placement of one profile on a model.
func MIGProfile(model, profile string) (MIGPlacement, bool) {
	for _, p := range migProfiles[model] {
		if p.Profile == profile {
			return p, true
		}
	}
	return MIGPlacement{}, false
}

var nonKey = regexp.MustCompile(`[^a-z0-9.]+`)

// families are matched in order: the first a name contains decides.
var families = []string{"gb200", "b200", "gh200", "h200", "h100", "a100", "a30", "a10g", "a10", "l40s", "l40", "l4", "t4", "v100", "mi300x", "mi250x"}

// maxModelKey is the longest model key, as compute.devices' check allows.
const maxModelKey = 64

// ModelKey turns the name hardware reports ("NVIDIA H100 80GB HBM3") into the short, stable key
// that requests, quotas and meters use ("h100"). Variants whose MIG profiles differ get a key of
// their own (a100-40gb, h100-94gb).
func ModelKey(name string, memoryMiB int64) string {
	n := strings.ToLower(name)
	for _, f := range families {
		if !strings.Contains(n, f) {
			continue
		}
		gib := (memoryMiB + 512) / 1024
		switch {
		case f == "a100" && gib > 0 && gib <= 48:
			return "a100-40gb"
		case f == "h100" && gib >= 90 && gib <= 100:
			return "h100-94gb"
		}
		return f
	}
	k := strings.Trim(nonKey.ReplaceAllString(strings.TrimPrefix(n, "nvidia "), "-"), "-.")
	if k == "" {
		return "gpu"
	}
	if len(k) > maxModelKey {
		k = k[:maxModelKey]
	}
	return k
}
