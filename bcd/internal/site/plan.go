package site

import (
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/compute/metal/siteapi"
)

// planIndex is a validated plan, copied so that the caller's later edits do not reach it, and
// indexed the ways the services look it up. It is never modified once built.
type planIndex struct {
	unknown string
	byMAC   map[string]*siteapi.PlanMachine
	byID    map[string]*siteapi.PlanMachine
	images  map[string]siteapi.Image // by SHA-256
	tasks   map[string]bool          // the machines' task ids
}

func indexPlan(p siteapi.Plan) (*planIndex, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	idx := &planIndex{
		unknown: p.Unknown,
		byMAC:   map[string]*siteapi.PlanMachine{},
		byID:    map[string]*siteapi.PlanMachine{},
		images:  map[string]siteapi.Image{},
		tasks:   map[string]bool{},
	}
	for i := range p.Machines {
		m := copyMachine(p.Machines[i])
		field := fmt.Sprintf("machines[%d]", i)
		if _, dup := idx.byID[m.ID]; dup {
			return nil, &siteapi.FieldError{Field: field + ".id", Problem: fmt.Sprintf("%q is listed twice", m.ID)}
		}
		// It travels on the ramdisk's kernel command line, written into an iPXE script.
		if !cmdlineSafe(m.ID, 64) {
			return nil, &siteapi.FieldError{Field: field + ".id", Problem: "at most 64 of A-Z a-z 0-9 . _ - : + / = ~"}
		}
		if m.Task != nil {
			idx.tasks[m.Task.ID] = true
		}
		idx.byID[m.ID] = m
		for _, mac := range m.MACs {
			idx.byMAC[mac] = m
		}
	}
	for _, im := range p.Images {
		if _, dup := idx.images[im.SHA256]; !dup { // the same bytes listed twice are fetched once
			idx.images[im.SHA256] = im
		}
	}
	return idx, nil
}

func copyMachine(m siteapi.PlanMachine) *siteapi.PlanMachine {
	c := m
	c.MACs = slices.Clone(m.MACs)
	if m.Task != nil {
		t := *m.Task
		if t.Image != nil {
			im := *t.Image
			t.Image = &im
		}
		c.Task = &t
	}
	return &c
}

func cmdlineSafe(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("._-:+/=~", r))
	})
}

// boot is how the plan says a machine that PXE-boots with a MAC is to be booted.
type boot struct {
	machine *siteapi.PlanMachine // nil: an unknown machine
	ramdisk bool                 // the ramdisk (as the machine, or as an unknown one); else its disk
}

// group is the MACs of mac's machine (mac alone for an unknown one): the NICs its ramdisk may
// take a lease on.
func (p *planIndex) group(mac string) []string {
	if p != nil {
		if m := p.byMAC[mac]; m != nil {
			return m.MACs
		}
	}
	return []string{mac}
}

// bootFor answers for a MAC: ok is false when the site does not answer it at all (no plan yet,
// or an unknown machine while the plan says ignore).
func (p *planIndex) bootFor(mac string) (b boot, ok bool) {
	if p == nil {
		return boot{}, false
	}
	if m := p.byMAC[mac]; m != nil {
		return boot{machine: m, ramdisk: m.Boot == siteapi.BootRamdisk}, true
	}
	if p.unknown == siteapi.UnknownInspect {
		return boot{ramdisk: true}, true
	}
	return boot{}, false
}
