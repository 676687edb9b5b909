package fleetconfig

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// state is a tenant's live fleet, in the document's terms: every kind, each object canonical
// (canon) and sorted by its key, with the ids an apply needs to change them.
type state struct {
	tenant string
	spec   api.FleetSpec
	ids    map[string]string // kind/key → id: site/fra1, pool/h100, webhook/<url>
	// dupURLs are URLs of more than one of the tenant's webhook endpoints: a document, which knows
	// endpoints by URL, cannot tell them apart.
	dupURLs map[string][]string
}

// readState reads tenant's live fleet in q. With lock set, the rows of the kinds in lock are
// locked (FOR NO KEY UPDATE) until q's transaction ends, so that nothing changes them between an
// apply's check of the fingerprint and its writes; the key-share locks of foreign keys (a
// reservation booking in a pool) are not blocked.
func readState(ctx context.Context, q postgres.Querier, tenant string, lock []string) (*state, error) {
	st := &state{tenant: tenant, ids: map[string]string{}, dupURLs: map[string][]string{}}
	suffix := func(kind, alias string) string {
		if !slices.Contains(lock, kind) {
			return ""
		}
		return " FOR NO KEY UPDATE OF " + alias
	}
	err := collect(ctx, q, `SELECT s.id::text, s.name, s.display_name, s.labels FROM compute.sites s WHERE s.tenant_id = $1`+suffix(api.FleetSites, "s"), tenant,
		func(r pgx.Rows) error {
			var id string
			var s api.FleetSite
			if err := r.Scan(&id, &s.Name, &s.DisplayName, &s.Labels); err != nil {
				return err
			}
			st.ids["site/"+s.Name] = id
			st.spec.Sites = append(st.spec.Sites, canonSite(s))
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = collect(ctx, q, `SELECT p.id::text, p.name, coalesce(s.name, ''), p.display_name, p.description, p.labels, p.tpm_attestation, p.tpm_ek_roots
		FROM compute.pools p LEFT JOIN compute.sites s ON s.id = p.site_id WHERE p.tenant_id = $1`+suffix(api.FleetPools, "p"), tenant,
		func(r pgx.Rows) error {
			var id string
			var p api.FleetPool
			var a api.PoolAttestation
			if err := r.Scan(&id, &p.Name, &p.Site, &p.DisplayName, &p.Description, &p.Labels, &a.TPM, &a.EKRoots); err != nil {
				return err
			}
			p.Attestation = &a
			st.ids["pool/"+p.Name] = id
			st.spec.Pools = append(st.spec.Pools, canonPool(p))
			return nil
		})
	if err != nil {
		return nil, err
	}
	// The quotas on the tenant's pools, whichever tenant they limit: they are decided in the
	// pool's tenant, as quotas.set decides them.
	err = collect(ctx, q, `SELECT q.tenant_id, p.name, q.resource, q.model, q."limit"
		FROM compute.quotas q JOIN compute.pools p ON p.id = q.pool_id WHERE p.tenant_id = $1`+suffix(api.FleetQuotas, "q"), tenant,
		func(r pgx.Rows) error {
			var o api.FleetQuota
			if err := r.Scan(&o.Tenant, &o.Pool, &o.Resource, &o.Model, &o.Limit); err != nil {
				return err
			}
			st.spec.Quotas = append(st.spec.Quotas, o)
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = collect(ctx, q, `SELECT w.id::text, w.url, w.description, w.event_types FROM compute.webhook_endpoints w WHERE w.tenant_id = $1`+suffix(api.FleetWebhooks, "w"), tenant,
		func(r pgx.Rows) error {
			var id string
			var w api.FleetWebhook
			if err := r.Scan(&id, &w.URL, &w.Description, &w.EventTypes); err != nil {
				return err
			}
			if other, ok := st.ids["webhook/"+w.URL]; ok {
				if len(st.dupURLs[w.URL]) == 0 {
					st.dupURLs[w.URL] = []string{other}
				}
				st.dupURLs[w.URL] = append(st.dupURLs[w.URL], id)
			}
			st.ids["webhook/"+w.URL] = id
			st.spec.Webhooks = append(st.spec.Webhooks, canonWebhook(w))
			return nil
		})
	if err != nil {
		return nil, err
	}
	sortSpec(&st.spec, tenant)
	return st, nil
}

func collect(ctx context.Context, q postgres.Querier, sql, tenant string, scan func(pgx.Rows) error) error {
	rows, err := q.Query(ctx, sql, tenant)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// sortSpec orders every list by its objects' keys, byte-wise (not by the database's collation),
// so that one state always renders and fingerprints the same.
func sortSpec(s *api.FleetSpec, tenant string) {
	slices.SortFunc(s.Sites, func(a, b api.FleetSite) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Pools, func(a, b api.FleetPool) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Quotas, func(a, b api.FleetQuota) int { return cmp.Compare(a.Key(tenant), b.Key(tenant)) })
	slices.SortStableFunc(s.Webhooks, func(a, b api.FleetWebhook) int { return cmp.Compare(a.URL, b.URL) })
}

// The canonical form of each kind: what the database cannot tell apart is written one way
// (no labels and empty labels, no attestation and TPM off without roots, event types in any order).
func canonSite(s api.FleetSite) api.FleetSite {
	if len(s.Labels) == 0 {
		s.Labels = nil
	}
	return s
}

func canonPool(p api.FleetPool) api.FleetPool {
	if len(p.Labels) == 0 {
		p.Labels = nil
	}
	if p.Attestation != nil {
		a := p.Attestation.WithDefaults()
		if len(a.EKRoots) == 0 {
			a.EKRoots = nil
		}
		p.Attestation = &a
		if a.TPM == api.TPMOff && a.EKRoots == nil {
			p.Attestation = nil
		}
	}
	return p
}

func canonQuota(q api.FleetQuota, tenant string) api.FleetQuota {
	if q.Tenant == "" {
		q.Tenant = tenant
	}
	return q
}

func canonWebhook(w api.FleetWebhook) api.FleetWebhook {
	if len(w.EventTypes) == 0 {
		w.EventTypes = nil
	} else {
		w.EventTypes = slices.Compact(slices.Sorted(slices.Values(w.EventTypes)))
	}
	return w
}

// managedOnly returns spec with the lists of the kinds manages does not name emptied, and
// manages in the canonical order.
func managedOnly(s api.FleetSpec, manages []string) api.FleetSpec {
	out := api.FleetSpec{}
	for _, k := range api.FleetKinds {
		if !slices.Contains(manages, k) {
			continue
		}
		out.Manages = append(out.Manages, k)
		switch k {
		case api.FleetSites:
			out.Sites = s.Sites
		case api.FleetPools:
			out.Pools = s.Pools
		case api.FleetQuotas:
			out.Quotas = s.Quotas
		case api.FleetWebhooks:
			out.Webhooks = s.Webhooks
		}
	}
	return out
}

// fingerprint is the live state's, as far as a document that manages manages sees it:
// sha256 of its canonical JSON. Counters (a quota's use, a pool's nodes) and ids are not in
// it: a plan stays good while only they change.
func (st *state) fingerprint(manages []string) string {
	b, err := json.Marshal(struct {
		Tenant string        `json:"tenant"`
		Spec   api.FleetSpec `json:"spec"`
	}{st.tenant, managedOnly(st.spec, manages)})
	if err != nil {
		panic(fmt.Sprintf("fleetconfig: fingerprint: %v", err)) // plain strings and maps always encode
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// config is the live state as a document that manages every kind: what fleet.export answers.
func (st *state) config() api.FleetConfig {
	return api.FleetConfig{APIVersion: api.FleetConfigAPIVersion, Kind: api.FleetConfigKind,
		Metadata: api.FleetMetadata{Tenant: st.tenant}, Spec: managedOnly(st.spec, api.FleetKinds)}
}
