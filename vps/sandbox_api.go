package vps

import (
	"regexp"
	"time"

	"github.com/better-compute/compute/api"
)

// IAM resource types of sandboxes.
const (
	ResourceSandboxTemplate = "vps-sandbox-template"
	ResourceSandbox         = "vps-sandbox"
	ResourceSnapshot        = "vps-snapshot"
)

// The sandbox methods.
var (
	SandboxTemplatesCreate = api.NewMethod[CreateSandboxTemplate, SandboxTemplate]("sandboxTemplates", "create", true, ResourceSandboxTemplate, "v0.5", "Define what sandboxes are made from: a flavor, an image, env, network policy, their time to live and how many wait warm.")
	SandboxTemplatesGet    = api.NewMethod[SandboxTemplateRef, SandboxTemplate]("sandboxTemplates", "get", false, ResourceSandboxTemplate, "v0.5", "Get a template, with its warm pool's count.")
	SandboxTemplatesList   = api.NewMethod[ListSandboxTemplates, api.Page[SandboxTemplate]]("sandboxTemplates", "list", false, ResourceSandboxTemplate, "v0.5", "List sandbox templates.")
	SandboxTemplatesDelete = api.NewMethod[SandboxTemplateRef, SandboxTemplate]("sandboxTemplates", "delete", true, ResourceSandboxTemplate, "v0.5", "Remove a template no live sandbox uses; its warm instances go.")

	SandboxesCreate  = api.NewMethod[CreateSandbox, Sandbox]("sandboxes", "create", true, ResourceSandbox, "v0.5", "Create a sandbox from a template: a warm one from its pool when it has one (resumed in milliseconds), else booted cold.")
	SandboxesGet     = api.NewMethod[SandboxRef, Sandbox]("sandboxes", "get", false, ResourceSandbox, "v0.5", "Get a sandbox.")
	SandboxesList    = api.NewMethod[ListSandboxes, api.Page[Sandbox]]("sandboxes", "list", false, ResourceSandbox, "v0.5", "List sandboxes.")
	SandboxesPause   = api.NewMethod[SandboxRef, Sandbox]("sandboxes", "pause", true, ResourceSandbox, "v0.5", "Pause a sandbox: its vCPUs stop, its memory stays; its time to live runs on.")
	SandboxesResume  = api.NewMethod[SandboxRef, Sandbox]("sandboxes", "resume", true, ResourceSandbox, "v0.5", "Resume a paused sandbox.")
	SandboxesExtend  = api.NewMethod[ExtendSandbox, Sandbox]("sandboxes", "extend", true, ResourceSandbox, "v0.5", "Move a sandbox's expiry, at most its template's maximum time to live after its creation.")
	SandboxesDelete  = api.NewMethod[SandboxRef, Sandbox]("sandboxes", "delete", true, ResourceSandbox, "v0.5", "Delete a sandbox now.")
	SandboxesConsole = api.NewMethod[SandboxRef, api.TunnelTicket]("sandboxes", "console", true, ResourceSandbox, "v0.5", "A single-use ticket to the sandbox's serial console.")
	SandboxesSSH     = api.NewMethod[SandboxRef, api.TunnelTicket]("sandboxes", "ssh", true, ResourceSandbox, "v0.5", "A single-use ticket to the sandbox's SSH, on its second serial port: log in with a certificate of access.sshCertificate for its reservation.")

	SandboxSnapshotsCreate  = api.NewMethod[CreateSnapshot, Snapshot]("sandboxSnapshots", "create", true, ResourceSnapshot, "v0.5", "Save a sandbox's whole state, memory included, on its host; it runs on.")
	SandboxSnapshotsList    = api.NewMethod[ListSnapshots, api.Page[Snapshot]]("sandboxSnapshots", "list", false, ResourceSnapshot, "v0.5", "List a sandbox's snapshots.")
	SandboxSnapshotsRestore = api.NewMethod[SnapshotRef, Snapshot]("sandboxSnapshots", "restore", true, ResourceSnapshot, "v0.5", "Put a sandbox back to one of its snapshots (memory and disk).")
	SandboxSnapshotsDelete  = api.NewMethod[SnapshotRef, Snapshot]("sandboxSnapshots", "delete", true, ResourceSnapshot, "v0.5", "Remove a snapshot; its host frees its space.")
)

// SandboxMethods are the sandbox methods.
func SandboxMethods() []api.MethodInfo {
	return []api.MethodInfo{SandboxTemplatesCreate.Info(), SandboxTemplatesGet.Info(), SandboxTemplatesList.Info(), SandboxTemplatesDelete.Info(),
		SandboxesCreate.Info(), SandboxesGet.Info(), SandboxesList.Info(), SandboxesPause.Info(), SandboxesResume.Info(),
		SandboxesExtend.Info(), SandboxesDelete.Info(), SandboxesConsole.Info(), SandboxesSSH.Info(),
		SandboxSnapshotsCreate.Info(), SandboxSnapshotsList.Info(), SandboxSnapshotsRestore.Info(), SandboxSnapshotsDelete.Info()}
}

// Limits of templates.
const (
	MaxWarm   = 64
	MaxEnv    = 64
	NetNone   = "none" // no network interface at all
	maxEnvLen = 4096
)

// SandboxTemplate is what sandboxes are made from.
type SandboxTemplate struct {
	ID       string            `json:"id"`
	TenantID string            `json:"tenantId"`
	Name     string            `json:"name"`
	PoolID   string            `json:"poolId"`
	Flavor   string            `json:"flavor"`
	Image    string            `json:"image"`
	Env      map[string]string `json:"env"`
	Network  string            `json:"network"`
	TTL      string            `json:"ttl"`    // a sandbox's time to live unless its create says otherwise
	MaxTTL   string            `json:"maxTTL"` // the most a sandbox may live, extensions included
	Warm     int               `json:"warm"`   // how many wait booted and paused
	// ReadyLine is what the guest prints on its serial console once it is up: a warm one is
	// paused when its host has seen it. Without one, a warm one is paused Warmup after its boot.
	ReadyLine string `json:"readyLine,omitempty"`
	// Warmup is, with a ReadyLine, the longest a warm one may take to print it (it is replaced
	// after); without, how long it runs after its boot before it is paused.
	Warmup string `json:"warmup"`
	// WarmReady is how many wait paused now on a host that could resume them (what a create
	// takes); WarmBooting how many are on their way.
	WarmReady   int       `json:"warmReady"`
	WarmBooting int       `json:"warmBooting"`
	CreatedBy   string    `json:"createdBy"`
	CreatedAt   time.Time `json:"createdAt"`
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// CreateSandboxTemplate is the input of sandboxTemplates.create.
type CreateSandboxTemplate struct {
	TenantID string            `json:"tenantId,omitempty"`
	Name     string            `json:"name"`
	Pool     string            `json:"pool"`
	Flavor   string            `json:"flavor"`
	Image    string            `json:"image"`
	Env      map[string]string `json:"env,omitempty"`
	// Network is the sandboxes' network policy: none (no interface, the default), or a network
	// of the tenant (its name or id) that each sandbox gets a NIC and an address on.
	Network string `json:"network,omitempty"`
	TTL     string `json:"ttl,omitempty"`    // default 1h
	MaxTTL  string `json:"maxTTL,omitempty"` // default 24h, and at least TTL
	Warm    int    `json:"warm,omitempty"`
	// ReadyLine is a part of a line the guest prints on its serial console once it is up.
	ReadyLine string `json:"readyLine,omitempty"`
	Warmup    string `json:"warmup,omitempty"` // default 5s, or 5m with a ReadyLine
}

// Durations returns the template's TTL, maximum TTL and warmup, defaults filled in.
func (in CreateSandboxTemplate) Durations() (ttl, maxTTL, warmup time.Duration, err error) {
	ttl, maxTTL, warmup = time.Hour, 24*time.Hour, 5*time.Second
	if in.ReadyLine != "" {
		warmup = 5 * time.Minute
	}
	for _, d := range []struct {
		field, v string
		dst      *time.Duration
	}{{"ttl", in.TTL, &ttl}, {"maxTTL", in.MaxTTL, &maxTTL}, {"warmup", in.Warmup, &warmup}} {
		if d.v == "" {
			continue
		}
		if *d.dst, err = api.ParseDuration(d.field, d.v); err != nil {
			return
		}
	}
	if in.MaxTTL == "" && ttl > maxTTL {
		maxTTL = ttl
	}
	switch {
	case maxTTL < ttl:
		err = api.InvalidField("maxTTL", "%s is shorter than the ttl %s", maxTTL, ttl)
	case ttl < time.Second:
		err = api.InvalidField("ttl", "must be at least a second")
	case warmup > time.Hour:
		err = api.InvalidField("warmup", "must be at most an hour")
	}
	return
}

// Validate implements the input check.
func (in CreateSandboxTemplate) Validate() error {
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	for f, v := range map[string]string{"pool": in.Pool, "flavor": in.Flavor, "image": in.Image} {
		if err := api.ValidateRef(f, v); err != nil {
			return err
		}
	}
	if err := validateEnv(in.Env); err != nil {
		return err
	}
	if in.Network != "" && in.Network != NetNone {
		if err := api.ValidateRef("network", in.Network); err != nil {
			return err
		}
	}
	if err := api.ValidateText("readyLine", in.ReadyLine, 256); err != nil {
		return err
	}
	if in.Warm < 0 || in.Warm > MaxWarm {
		return api.InvalidField("warm", "must be between 0 and %d", MaxWarm)
	}
	_, _, _, err := in.Durations()
	return err
}

func validateEnv(env map[string]string) error {
	if len(env) > MaxEnv {
		return api.InvalidField("env", "at most %d variables", MaxEnv)
	}
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return api.InvalidField("env", "%q is not a variable name (letters, digits and _, not first a digit)", k)
		}
		if err := api.ValidateText("env."+k, v, maxEnvLen); err != nil {
			return err
		}
	}
	return nil
}

// SandboxTemplateRef names a template.
type SandboxTemplateRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Template string `json:"template"` // id or name
}

// Validate implements the input check.
func (in SandboxTemplateRef) Validate() error { return api.ValidateRef("template", in.Template) }

// ListSandboxTemplates is the input of sandboxTemplates.list.
type ListSandboxTemplates struct {
	TenantID string `json:"tenantId,omitempty"`
	api.PageRequest
}

// Sandbox is an instance made from a template, that lives until it expires.
type Sandbox struct {
	Instance
	Template     string    `json:"template"`
	TemplateID   string    `json:"templateId"`
	ExpiresAt    time.Time `json:"expiresAt"`
	FromWarmPool bool      `json:"fromWarmPool"` // taken from the template's warm pool, not booted for it
}

// CreateSandbox is the input of sandboxes.create.
type CreateSandbox struct {
	TenantID string            `json:"tenantId,omitempty"`
	Template string            `json:"template"`
	Name     string            `json:"name,omitempty"` // default: sbx-<a part of its id>
	TTL      string            `json:"ttl,omitempty"`  // default the template's; at most its maxTTL
	Labels   map[string]string `json:"labels,omitempty"`
}

// Validate implements the input check.
func (in CreateSandbox) Validate() error {
	if err := api.ValidateRef("template", in.Template); err != nil {
		return err
	}
	if in.Name != "" {
		if err := api.ValidateName("name", in.Name); err != nil {
			return err
		}
	}
	if in.TTL != "" {
		if err := validateTTL(in.TTL); err != nil {
			return err
		}
	}
	return api.ValidateLabels("labels", in.Labels)
}

// SandboxRef names a sandbox.
type SandboxRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Sandbox  string `json:"sandbox"` // id or name
}

// Validate implements the input check.
func (in SandboxRef) Validate() error { return api.ValidateRef("sandbox", in.Sandbox) }

// ExtendSandbox is the input of sandboxes.extend.
type ExtendSandbox struct {
	SandboxRef
	TTL string `json:"ttl"` // from now
}

// Validate implements the input check.
func (in ExtendSandbox) Validate() error {
	if err := in.SandboxRef.Validate(); err != nil {
		return err
	}
	return validateTTL(in.TTL)
}

// validateTTL checks a sandbox's time to live: a duration of at least a second (a template's
// ttl is held to the same).
func validateTTL(s string) error {
	d, err := api.ParseDuration("ttl", s)
	if err == nil && d < time.Second {
		err = api.InvalidField("ttl", "%s is less than a second", d)
	}
	return err
}

// ListSandboxes is the input of sandboxes.list.
type ListSandboxes struct {
	TenantID string `json:"tenantId,omitempty"`
	Template string `json:"template,omitempty"` // a template's id
	Deleted  bool   `json:"deleted,omitempty"`  // deleted and expired ones too
	api.PageRequest
}

// Validate implements the input check.
func (in ListSandboxes) Validate() error {
	if in.Template != "" {
		if err := api.ValidateRef("template", in.Template); err != nil {
			return err
		}
	}
	return in.PageRequest.Validate()
}

// Snapshot is a saved state of a sandbox, kept by its host.
type Snapshot struct {
	ID           string     `json:"id"`
	TenantID     string     `json:"tenantId"`
	Name         string     `json:"name"`
	SandboxID    string     `json:"sandboxId"`
	Status       string     `json:"status"` // pending (being saved), ready, failed (StatusDetail says why), deleted
	StatusDetail string     `json:"statusDetail,omitempty"`
	CreatedBy    string     `json:"createdBy"`
	CreatedAt    time.Time  `json:"createdAt"`
	DeletedAt    *time.Time `json:"deletedAt,omitempty"`
}

// CreateSnapshot is the input of sandboxSnapshots.create.
type CreateSnapshot struct {
	SandboxRef
	Name string `json:"name"`
}

// Validate implements the input check.
func (in CreateSnapshot) Validate() error {
	if err := in.SandboxRef.Validate(); err != nil {
		return err
	}
	return api.ValidateName("name", in.Name)
}

// ListSnapshots is the input of sandboxSnapshots.list.
type ListSnapshots struct {
	SandboxRef
	api.PageRequest
}

// Validate implements the input check (both embedded types have one).
func (in ListSnapshots) Validate() error {
	if err := in.SandboxRef.Validate(); err != nil {
		return err
	}
	return in.PageRequest.Validate()
}

// SnapshotRef names a snapshot.
type SnapshotRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Snapshot string `json:"snapshot"` // id
}

// Validate implements the input check.
func (in SnapshotRef) Validate() error { return api.ValidateRef("snapshot", in.Snapshot) }
