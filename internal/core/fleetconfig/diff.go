package fleetconfig

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/better-compute/compute/api"
)

// The kinds of objects, as changes name them.
const (
	kindSite    = "site"
	kindPool    = "pool"
	kindQuota   = "quota"
	kindWebhook = "webhook"
)

// step is one change and what an apply needs to make it: the object wanted (a creation or an
// update) or the one live (a deletion), and the live object's id.
type step struct {
	change api.FleetChange
	object any // api.FleetSite, api.FleetPool, api.FleetQuota or api.FleetWebhook
	id     string
}

// plan is what applying a document to a state would do, in the order it would do it.
type plan struct {
	steps []step
	kept  []api.FleetObject
}

func (p *plan) changes() []api.FleetChange {
	out := make([]api.FleetChange, len(p.steps))
	for i, s := range p.steps {
		out[i] = s.change
	}
	return out
}

func summarize(cs []api.FleetChange) api.FleetSummary {
	var s api.FleetSummary
	for _, c := range cs {
		switch c.Action {
		case api.FleetCreate:
			s.Create++
		case api.FleetUpdate:
			s.Update++
		case api.FleetDelete:
			s.Delete++
		}
	}
	return s
}

// normalize returns cfg for tenant: its objects canonical, each quota's tenant filled in.
func normalize(cfg api.FleetConfig, tenant string) api.FleetConfig {
	cfg.Metadata.Tenant = tenant
	s := &cfg.Spec
	s.Manages = managedOnly(api.FleetSpec{}, s.Manages).Manages
	s.Sites = mapped(s.Sites, canonSite)
	s.Pools = mapped(s.Pools, canonPool)
	s.Quotas = mapped(s.Quotas, func(q api.FleetQuota) api.FleetQuota { return canonQuota(q, tenant) })
	s.Webhooks = mapped(s.Webhooks, canonWebhook)
	return cfg
}

func mapped[T any](in []T, f func(T) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// field is one field of an object as a change shows it.
type field struct {
	name  string
	value any
}

func siteFields(s api.FleetSite) []field {
	return []field{{"displayName", s.DisplayName}, {"labels", s.Labels}}
}

func poolFields(p api.FleetPool) []field {
	return []field{{"site", p.Site}, {"displayName", p.DisplayName}, {"description", p.Description}, {"labels", p.Labels}, {"attestation", p.Attestation}}
}

func quotaFields(q api.FleetQuota) []field { return []field{{"limit", q.Limit}} }

func webhookFields(w api.FleetWebhook) []field {
	return []field{{"description", w.Description}, {"eventTypes", w.EventTypes}}
}

// kindDiff is the changes of one kind: creations and updates, deletions, and what is kept.
type kindDiff struct {
	upserts, deletes []step
	kept             []api.FleetObject
}

// diffKind compares the objects of one kind that a document wants with the live ones, by key.
// Without prune, live objects the document does not list are kept.
func diffKind[T any](kind, list string, want, have []T, key func(T) string, fields func(T) []field, ids map[string]string, prune bool) kindDiff {
	var d kindDiff
	live := make(map[string]T, len(have))
	for _, h := range have {
		live[key(h)] = h
	}
	order := make([]int, len(want))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(key(want[a]), key(want[b])) })
	listed := map[string]bool{}
	for _, i := range order {
		w, k := want[i], key(want[i])
		listed[k] = true
		c := api.FleetChange{Kind: kind, Key: k, Path: fmt.Sprintf("%s[%d]", list, i)}
		h, exists := live[k]
		if !exists {
			c.Action = api.FleetCreate
			for _, f := range fields(w) {
				if shown(f.value) {
					c.Fields = append(c.Fields, api.FieldChange{Field: f.name, New: f.value})
				}
			}
			d.upserts = append(d.upserts, step{change: c, object: w})
			continue
		}
		wf, hf := fields(w), fields(h)
		for j := range wf {
			if !reflect.DeepEqual(wf[j].value, hf[j].value) {
				c.Fields = append(c.Fields, api.FieldChange{Field: wf[j].name, Old: hf[j].value, New: wf[j].value})
			}
		}
		if len(c.Fields) > 0 {
			c.Action = api.FleetUpdate
			d.upserts = append(d.upserts, step{change: c, object: w, id: ids[kind+"/"+k]})
		}
	}
	for _, h := range have { // sorted by key already
		k := key(h)
		if listed[k] {
			continue
		}
		if !prune {
			d.kept = append(d.kept, api.FleetObject{Kind: kind, Key: k})
			continue
		}
		c := api.FleetChange{Action: api.FleetDelete, Kind: kind, Key: k}
		for _, f := range fields(h) {
			if shown(f.value) {
				c.Fields = append(c.Fields, api.FieldChange{Field: f.name, Old: f.value})
			}
		}
		d.deletes = append(d.deletes, step{change: c, object: h, id: ids[kind+"/"+k]})
	}
	return d
}

// shown reports whether a field of an object created or deleted is worth showing: anything
// but an empty string, map, list or absent policy. A number always is (a limit of 0 means something).
func shown(v any) bool {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int:
		return true
	case reflect.Invalid:
		return false
	case reflect.Pointer, reflect.Map, reflect.Slice:
		return !rv.IsNil() && (rv.Kind() == reflect.Pointer || rv.Len() > 0)
	}
	return !rv.IsZero()
}

// diff plans doc (normalized) against st: creations and updates in the order sites, pools,
// quotas, webhooks (what a pool or a quota refers to exists first), then deletions the other way
// round. Objects of kinds doc does not manage are neither compared nor touched. Strict (a plan,
// an apply), it refuses a document whose references would not hold after the apply, and what
// the API cannot do; otherwise (drift) it only compares.
func diff(doc api.FleetConfig, st *state, prune, strict bool) (*plan, error) {
	s := doc.Spec
	tenant := doc.Metadata.Tenant
	if strict {
		if err := refuse(doc, st, prune); err != nil {
			return nil, err
		}
	}
	var kinds []kindDiff
	for _, k := range api.FleetKinds {
		if !s.Managed(k) {
			continue
		}
		switch k {
		case api.FleetSites:
			kinds = append(kinds, diffKind(kindSite, "spec.sites", s.Sites, st.spec.Sites, func(o api.FleetSite) string { return o.Name }, siteFields, st.ids, prune))
		case api.FleetPools:
			kinds = append(kinds, diffKind(kindPool, "spec.pools", s.Pools, st.spec.Pools, func(o api.FleetPool) string { return o.Name }, poolFields, st.ids, prune))
		case api.FleetQuotas:
			kinds = append(kinds, diffKind(kindQuota, "spec.quotas", s.Quotas, st.spec.Quotas, func(o api.FleetQuota) string { return o.Key(tenant) }, quotaFields, st.ids, prune))
		case api.FleetWebhooks:
			kinds = append(kinds, diffKind(kindWebhook, "spec.webhooks", s.Webhooks, st.spec.Webhooks, func(o api.FleetWebhook) string { return o.URL }, webhookFields, st.ids, prune))
		}
	}
	p := &plan{kept: []api.FleetObject{}}
	for _, d := range kinds {
		p.steps = append(p.steps, d.upserts...)
		p.kept = append(p.kept, d.kept...)
	}
	for i := len(kinds) - 1; i >= 0; i-- {
		p.steps = append(p.steps, kinds[i].deletes...)
	}
	return p, nil
}

// refuse refuses what an apply of doc to st could not do: a pool at a site, or a quota on a
// pool, that will not exist once the document is applied (neither in the document nor live and
// kept); a pool moved to another site; webhooks managed while two endpoints share a URL.
func refuse(doc api.FleetConfig, st *state, prune bool) error {
	s := doc.Spec
	tenant := doc.Metadata.Tenant
	if s.Managed(api.FleetWebhooks) && len(st.dupURLs) > 0 {
		urls := make([]string, 0, len(st.dupURLs))
		for u := range st.dupURLs {
			urls = append(urls, u)
		}
		slices.Sort(urls)
		u := urls[0]
		return &api.Error{Code: api.CodeFailedPrecondition,
			Message: fmt.Sprintf("tenant %s has %d webhook endpoints with URL %s (%s); a FleetConfig knows endpoints by URL: delete all but one (webhooks.delete) before it manages webhooks",
				tenant, len(st.dupURLs[u]), u, strings.Join(st.dupURLs[u], ", ")),
			Details: map[string]any{"reason": "duplicate_webhook_url", "url": u, "webhooks": st.dupURLs[u]}}
	}
	for i, p := range s.Pools {
		for _, h := range st.spec.Pools {
			if h.Name == p.Name && h.Site != p.Site {
				f := fmt.Sprintf("spec.pools[%d].site", i)
				return &api.Error{Code: api.CodeFailedPrecondition,
					Message: fmt.Sprintf("%s: pool %s is at site %q, not %q; a pool cannot move to another site: delete it and create it anew", f, p.Name, h.Site, p.Site),
					Details: map[string]any{"field": f, "reason": "pool_site_fixed"}}
			}
		}
	}
	after := func(kind string, listed []string, live []string) map[string]bool {
		out := map[string]bool{}
		if !s.Managed(kind) || !prune {
			for _, n := range live {
				out[n] = true
			}
		}
		if s.Managed(kind) {
			for _, n := range listed {
				out[n] = true
			}
		}
		return out
	}
	names := func(n int, name func(int) string) []string {
		out := make([]string, n)
		for i := range n {
			out[i] = name(i)
		}
		return out
	}
	sites := after(api.FleetSites, names(len(s.Sites), func(i int) string { return s.Sites[i].Name }),
		names(len(st.spec.Sites), func(i int) string { return st.spec.Sites[i].Name }))
	pools := after(api.FleetPools, names(len(s.Pools), func(i int) string { return s.Pools[i].Name }),
		names(len(st.spec.Pools), func(i int) string { return st.spec.Pools[i].Name }))
	for i, p := range s.Pools {
		if p.Site != "" && !sites[p.Site] {
			return api.InvalidField(fmt.Sprintf("spec.pools[%d].site", i), "no site %q: it is neither in the document's sites nor a site of tenant %s that the apply keeps", p.Site, tenant)
		}
	}
	for i, q := range s.Quotas {
		if !pools[q.Pool] {
			return api.InvalidField(fmt.Sprintf("spec.quotas[%d].pool", i), "no pool %q: it is neither in the document's pools nor a pool of tenant %s that the apply keeps", q.Pool, tenant)
		}
	}
	return nil
}
