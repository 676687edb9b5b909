package api

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ResourceFleet is the IAM resource type of a tenant's fleet as code (FleetConfig): one
// decision on it covers every site, pool, quota and webhook an apply writes.
const ResourceFleet = "compute-fleet"

// The fleet group: a tenant's sites, pools, quotas and webhooks as one document (docs/fleet.md).
var (
	FleetExport = NewMethod[ExportFleet, ExportedFleet]("fleet", "export", false, ResourceFleet, "v1.0", "The tenant's sites, pools, quotas and webhooks as one FleetConfig document (YAML), without secrets.")
	FleetPlan   = NewMethod[PlanFleet, FleetDiff]("fleet", "plan", false, ResourceFleet, "v1.0", "What applying a FleetConfig would create, update and delete, field by field, and the fingerprint of the live state it was computed against.")
	FleetApply  = NewMethod[ApplyFleet, AppliedFleet]("fleet", "apply", true, ResourceFleet, "v1.0", "Apply a FleetConfig in one transaction, if the live state still has the plan's fingerprint.")
	FleetDrift  = NewMethod[GetFleetDrift, DriftReport]("fleet", "drift", false, ResourceFleet, "v1.0", "How the live state differs now from the FleetConfig last applied.")
)

// FleetConfigMethods returns the fleet group.
func FleetConfigMethods() []MethodInfo { return infos(fleetConfigTable()) }

func fleetConfigTable() []Describer {
	return []Describer{FleetExport, FleetPlan, FleetApply, FleetDrift}
}

// The FleetConfig document's version and kind.
const (
	FleetConfigAPIVersion = "compute/v1"
	FleetConfigKind       = "FleetConfig"
)

// What a FleetConfig may manage: spec.manages names some of these.
const (
	FleetSites    = "sites"
	FleetPools    = "pools"
	FleetQuotas   = "quotas"
	FleetWebhooks = "webhooks"
)

// FleetKinds lists what a FleetConfig may manage, in the order an apply creates them.
var FleetKinds = []string{FleetSites, FleetPools, FleetQuotas, FleetWebhooks}

// Limits of a FleetConfig.
const (
	MaxFleetDocumentBytes = 512 << 10
	MaxFleetObjects       = 2000 // of each kind
)

// FleetConfig is a tenant's fleet as one document: what it manages (spec.manages) and the
// objects of those kinds it wants. It carries no secrets: a webhook's signing secret is kept
// by the endpoint, never exported.
type FleetConfig struct {
	APIVersion string        `json:"apiVersion"` // compute/v1
	Kind       string        `json:"kind"`       // FleetConfig
	Metadata   FleetMetadata `json:"metadata"`
	Spec       FleetSpec     `json:"spec"`
}

// FleetMetadata says whose fleet a document is.
type FleetMetadata struct {
	// Tenant is the tenant the document describes; empty: the caller's. An apply refuses a
	// document of one tenant sent for another.
	Tenant string `json:"tenant,omitempty"`
}

// FleetSpec is what a document wants. Objects of a kind it manages that it does not list are
// deleted only by an apply with prune; objects of kinds it does not manage are never touched.
type FleetSpec struct {
	Manages  []string       `json:"manages"`
	Sites    []FleetSite    `json:"sites,omitempty"`
	Pools    []FleetPool    `json:"pools,omitempty"`
	Quotas   []FleetQuota   `json:"quotas,omitempty"`
	Webhooks []FleetWebhook `json:"webhooks,omitempty"`
}

// FleetSite is a site, known by its name.
type FleetSite struct {
	Name        string            `json:"name"`
	DisplayName string            `json:"displayName,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// FleetPool is a pool, known by its name. A field left out is its default (empty, TPM off).
type FleetPool struct {
	Name        string            `json:"name"`
	Site        string            `json:"site,omitempty"` // a site's name
	DisplayName string            `json:"displayName,omitempty"`
	Description string            `json:"description,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Attestation *PoolAttestation  `json:"attestation,omitempty"` // absent: tpm off, no roots
}

// FleetQuota is a quota on one of the tenant's pools, known by tenant, pool, resource and model.
type FleetQuota struct {
	Tenant   string `json:"tenant,omitempty"` // the tenant limited: the document's or a descendant; default the document's
	Pool     string `json:"pool"`             // a pool's name
	Resource string `json:"resource"`         // gpus, vcpus or memoryGiB
	Model    string `json:"model,omitempty"`  // gpus only: one model; empty: all
	Limit    int    `json:"limit"`
}

// FleetWebhook is a webhook endpoint, known by its URL. Its signing secret is not part of the
// document: an endpoint that exists keeps its own, a new one's is answered once by fleet.apply.
type FleetWebhook struct {
	URL         string   `json:"url"`
	Description string   `json:"description,omitempty"`
	EventTypes  []string `json:"eventTypes,omitempty"` // empty: every event
}

// Validate checks what can be checked of a document without the database: its version and
// kind, what it manages, every object's fields and duplicates. Errors name the field by its
// path in the document (spec.pools[2].labels).
func (c FleetConfig) Validate() error {
	if c.APIVersion != FleetConfigAPIVersion {
		return InvalidField("apiVersion", "%q is not a FleetConfig version: use %s", c.APIVersion, FleetConfigAPIVersion)
	}
	if c.Kind != FleetConfigKind {
		return InvalidField("kind", "%q: must be %s", c.Kind, FleetConfigKind)
	}
	if err := ValidateText("metadata.tenant", c.Metadata.Tenant, 253); err != nil {
		return err
	}
	s := c.Spec
	if len(s.Manages) == 0 {
		return InvalidField("spec.manages", "is required: name what the document manages, of %s", strings.Join(FleetKinds, ", "))
	}
	for i, k := range s.Manages {
		f := fmt.Sprintf("spec.manages[%d]", i)
		if !slices.Contains(FleetKinds, k) {
			return InvalidField(f, "%q is not something a FleetConfig manages: use %s", k, strings.Join(FleetKinds, ", "))
		}
		if slices.Index(s.Manages, k) != i {
			return InvalidField(f, "%q is listed twice", k)
		}
	}
	listed := map[string]int{FleetSites: len(s.Sites), FleetPools: len(s.Pools), FleetQuotas: len(s.Quotas), FleetWebhooks: len(s.Webhooks)}
	for _, k := range FleetKinds {
		if listed[k] > 0 && !s.Managed(k) {
			return InvalidField("spec."+k, "lists %d %s, but spec.manages does not name %s: add it, or the document would not manage them", listed[k], k, k)
		}
		if listed[k] > MaxFleetObjects {
			return InvalidField("spec."+k, "lists %d; the limit is %d", listed[k], MaxFleetObjects)
		}
	}
	for i, o := range s.Sites {
		if err := o.validate(fmt.Sprintf("spec.sites[%d]", i)); err != nil {
			return err
		}
	}
	for i, o := range s.Pools {
		if err := o.validate(fmt.Sprintf("spec.pools[%d]", i)); err != nil {
			return err
		}
	}
	for i, o := range s.Quotas {
		if err := o.validate(fmt.Sprintf("spec.quotas[%d]", i)); err != nil {
			return err
		}
	}
	for i, o := range s.Webhooks {
		if err := o.validate(fmt.Sprintf("spec.webhooks[%d]", i)); err != nil {
			return err
		}
	}
	return first(
		unique("spec.sites", "name", len(s.Sites), func(i int) string { return s.Sites[i].Name }),
		unique("spec.pools", "name", len(s.Pools), func(i int) string { return s.Pools[i].Name }),
		unique("spec.quotas", "tenant, pool, resource and model", len(s.Quotas), func(i int) string { return s.Quotas[i].Key(c.Metadata.Tenant) }),
		unique("spec.webhooks", "url", len(s.Webhooks), func(i int) string { return s.Webhooks[i].URL }),
	)
}

// Managed reports whether the spec manages kind (sites, pools, quotas, webhooks).
func (s FleetSpec) Managed(kind string) bool { return slices.Contains(s.Manages, kind) }

func (o FleetSite) validate(path string) error {
	return Under(path, CreateSite{Name: o.Name, DisplayName: o.DisplayName, Labels: o.Labels}.Validate())
}

func (o FleetPool) validate(path string) error {
	err := CreatePool{Name: o.Name, DisplayName: o.DisplayName, Description: o.Description, Labels: o.Labels, Attestation: o.Attestation}.Validate()
	if err == nil && o.Site != "" {
		err = ValidateName("site", o.Site)
	}
	return Under(path, err)
}

func (o FleetQuota) validate(path string) error {
	err := ValidateText("tenant", o.Tenant, 253)
	if err == nil {
		err = ValidateName("pool", o.Pool)
	}
	if err == nil && o.Resource == "" {
		err = InvalidField("resource", "is required: gpus, vcpus or memoryGiB")
	}
	if err == nil {
		err = validateQuotaResource(o.Resource, o.Model)
	}
	if err == nil && o.Limit < 0 {
		err = InvalidField("limit", "must not be negative, got %d", o.Limit)
	}
	return Under(path, err)
}

func (o FleetWebhook) validate(path string) error {
	return Under(path, CreateWebhook{URL: o.URL, EventTypes: o.EventTypes, Description: o.Description}.Validate())
}

// Key is what a quota is known by: tenant/pool/resource, and /model when it has one. tenant is
// the document's, for a quota that names none.
func (o FleetQuota) Key(tenant string) string {
	if o.Tenant != "" {
		tenant = o.Tenant
	}
	k := tenant + "/" + o.Pool + "/" + o.Resource
	if o.Model != "" {
		k += "/" + o.Model
	}
	return k
}

// unique refuses two entries of a list with one key.
func unique(list, what string, n int, key func(int) string) error {
	seen := make(map[string]int, n)
	for i := range n {
		k := key(i)
		if j, ok := seen[k]; ok {
			return InvalidField(fmt.Sprintf("%s[%d]", list, i), "has the same %s as %s[%d] (%s): each object appears once", what, list, j, k)
		}
		seen[k] = i
	}
	return nil
}

// Under returns err, an invalid_argument naming a field of an object, with the field moved under
// path, the object's place in a larger input: labels becomes spec.sites[0].labels. Any other
// error is returned with path before its message.
func Under(path string, err error) error {
	var e *Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	field, _ := e.Details["field"].(string)
	full := path
	if field != "" {
		full = path + "." + field
	}
	out := e.With("field", full)
	if rest, ok := strings.CutPrefix(e.Message, field); ok && field != "" {
		out.Message = full + rest
	} else {
		out.Message = path + ": " + e.Message
	}
	return out
}

// ExportFleet is the input of fleet.export.
type ExportFleet struct {
	TenantID string `json:"tenantId,omitempty"` // default: the caller's tenant
}

// ExportedFleet is the answer of fleet.export: the tenant's fleet as a FleetConfig that manages
// every kind, as YAML (Document, deterministic: the same state exports the same bytes) and as
// a value (Config).
type ExportedFleet struct {
	TenantID string `json:"tenantId"`
	// Fingerprint is the live state's (docs/fleet.md): a plan of this very document against
	// this state has it too, and no changes.
	Fingerprint string      `json:"fingerprint"`
	Document    string      `json:"document"`
	Config      FleetConfig `json:"config"`
}

// PlanFleet is the input of fleet.plan.
type PlanFleet struct {
	TenantID string `json:"tenantId,omitempty"` // default: the document's metadata.tenant, else the caller's
	// Document is a FleetConfig as YAML (or JSON, which is YAML too).
	Document string `json:"document"`
	// Prune plans the deletion of the objects of managed kinds that the document does not list.
	Prune bool `json:"prune,omitempty"`
}

// Validate implements the input check.
func (in PlanFleet) Validate() error { return validateDocument(in.Document) }

// ApplyFleet is the input of fleet.apply.
type ApplyFleet struct {
	TenantID string `json:"tenantId,omitempty"` // default: the document's metadata.tenant, else the caller's
	Document string `json:"document"`           // as for fleet.plan
	// Fingerprint is the plan's: the apply is refused (failed_precondition, reason stale_plan)
	// when the live state has changed since.
	Fingerprint string `json:"fingerprint"`
	Prune       bool   `json:"prune,omitempty"` // delete what the document does not list, as the plan did
}

// Validate implements the input check.
func (in ApplyFleet) Validate() error {
	if err := validateDocument(in.Document); err != nil {
		return err
	}
	if in.Fingerprint == "" {
		return InvalidField("fingerprint", "is required: the fingerprint fleet.plan answered for this document")
	}
	if !strings.HasPrefix(in.Fingerprint, "sha256:") || len(in.Fingerprint) != len("sha256:")+64 {
		return InvalidField("fingerprint", "%q is not a fingerprint fleet.plan answered (sha256:…)", in.Fingerprint)
	}
	return nil
}

func validateDocument(doc string) error {
	if strings.TrimSpace(doc) == "" {
		return InvalidField("document", "is required: a FleetConfig document (YAML)")
	}
	if len(doc) > MaxFleetDocumentBytes {
		return InvalidField("document", "is %d bytes; the limit is %d", len(doc), MaxFleetDocumentBytes)
	}
	return nil
}

// GetFleetDrift is the input of fleet.drift.
type GetFleetDrift struct {
	TenantID string `json:"tenantId,omitempty"`
}

// Fleet change actions.
const (
	FleetCreate = "create"
	FleetUpdate = "update"
	FleetDelete = "delete"
)

// FleetChange is one object an apply creates, updates or deletes.
type FleetChange struct {
	Action string `json:"action"` // create, update, delete
	Kind   string `json:"kind"`   // site, pool, quota, webhook
	// Key is what the object is known by: a site's or pool's name, a quota's
	// tenant/pool/resource[/model], a webhook's URL.
	Key    string        `json:"key"`
	Path   string        `json:"path,omitempty"` // the object in the document (spec.pools[1]); none for a deletion
	Fields []FieldChange `json:"fields,omitempty"`
}

// FieldChange is one field of a change: its value in the live state (Old) and in the document
// (New); a creation has no Old, a deletion no New.
type FieldChange struct {
	Field string `json:"field"`
	Old   any    `json:"old,omitempty"`
	New   any    `json:"new,omitempty"`
}

// FleetObject names an object of the live state.
type FleetObject struct {
	Kind string `json:"kind"`
	Key  string `json:"key"`
}

// FleetSummary counts a plan's changes.
type FleetSummary struct {
	Create int `json:"create"`
	Update int `json:"update"`
	Delete int `json:"delete"`
}

// FleetDiff is the answer of fleet.plan.
type FleetDiff struct {
	TenantID string `json:"tenantId"`
	// Fingerprint is the live state's that the plan was computed against: fleet.apply takes it,
	// and refuses to apply once the state has changed.
	Fingerprint string        `json:"fingerprint"`
	Prune       bool          `json:"prune"`
	Changes     []FleetChange `json:"changes"` // in the order an apply makes them
	// Kept are the objects of managed kinds the document does not list: an apply without
	// prune leaves them, with prune they are among Changes as deletions.
	Kept    []FleetObject `json:"kept"`
	Summary FleetSummary  `json:"summary"`
}

// AppliedFleet is the answer of fleet.apply.
type AppliedFleet struct {
	TenantID    string        `json:"tenantId"`
	Fingerprint string        `json:"fingerprint"` // the live state's after the apply
	Changes     []FleetChange `json:"changes"`
	Summary     FleetSummary  `json:"summary"`
	AppliedBy   string        `json:"appliedBy"`
	AppliedAt   time.Time     `json:"appliedAt"`
	// Secrets are the signing secrets of the webhook endpoints the apply created, by URL: shown
	// once, as webhooks.create shows one.
	Secrets map[string]string `json:"secrets,omitempty"`
}

// ForReplay is what an idempotent replay answers: the secrets are shown once.
func (a AppliedFleet) ForReplay() any {
	a.Secrets = nil
	return a
}

// FleetApplyRecord is who applied a tenant's FleetConfig last, and when.
type FleetApplyRecord struct {
	AppliedBy   string    `json:"appliedBy"`
	AppliedAt   time.Time `json:"appliedAt"`
	Fingerprint string    `json:"fingerprint"` // the live state's after that apply
	Prune       bool      `json:"prune"`
	Document    string    `json:"document"` // the document applied, as YAML
}

// DriftReport is the answer of fleet.drift: what an apply of the last applied document would
// change now. Nothing applied yet: Applied is absent and nothing has drifted.
type DriftReport struct {
	TenantID  string            `json:"tenantId"`
	Applied   *FleetApplyRecord `json:"applied,omitempty"`
	Drifted   bool              `json:"drifted"`
	Changes   []FleetChange     `json:"changes"` // Old: the live value; New: the document's
	Kept      []FleetObject     `json:"kept"`
	CheckedAt time.Time         `json:"checkedAt"`
}
