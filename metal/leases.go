package metal

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// A dedicated-root lease books a whole machine for its holder for a time, deploys the holder's
// image with the holder's SSH keys, and hands it over; when it ends (leases.end, or its time
// runs out) the machine is released: wiped and powered off. The booking is a row guarded by an
// exclusion constraint, as GPU bookings are: a machine is never leased twice at once.

// ResourceLease is the IAM resource type of leases.
const ResourceLease = "metal-lease"

// Limits of leases.
const (
	DefaultLeaseDuration = 24 * time.Hour
	MaxLeaseDuration     = 366 * 24 * time.Hour
)

// The lease methods.
var (
	LeasesCreate = api.NewMethod[CreateLease, Lease]("leases", "create", true, ResourceLease, "v0.5", "Lease a whole machine with root: it is deployed with your image and SSH keys and handed over, then wiped when the lease ends.")
	LeasesGet    = api.NewMethod[LeaseRef, Lease]("leases", "get", false, ResourceLease, "v0.5", "Get a lease.")
	LeasesList   = api.NewMethod[ListLeases, api.Page[Lease]]("leases", "list", false, ResourceLease, "v0.5", "List leases.")
	LeasesEnd    = api.NewMethod[LeaseRef, Lease]("leases", "end", true, ResourceLease, "v0.5", "End a lease now: its machine is wiped and powered off.")
)

// Lease is a dedicated-root lease of a machine.
type Lease struct {
	ID       string    `json:"id"`
	TenantID string    `json:"tenantId"`
	Machine  string    `json:"machine"`
	Holder   string    `json:"holder"` // the principal that leased it
	Image    string    `json:"image"`
	SSHKeys  []string  `json:"sshKeys"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	// State: deploying (the machine is being deployed for it), ready (handed over), releasing
	// (ended: being wiped), ended, failed.
	State     string     `json:"state"`
	Run       string     `json:"run"` // the deploy's run, then the release's
	Error     string     `json:"error,omitempty"`
	CreatedAt time.Time  `json:"createdAt"`
	EndedAt   *time.Time `json:"endedAt,omitempty"`
}

// CreateLease is the input of leases.create: a machine (by id or name), or any available
// machine of a site.
type CreateLease struct {
	TenantID string   `json:"tenantId,omitempty"`
	Machine  string   `json:"machine,omitempty"`
	Site     string   `json:"site,omitempty"`
	Image    string   `json:"image"`
	SSHKeys  []string `json:"sshKeys"`
	Duration string   `json:"duration,omitempty"` // default 24h
}

// Validate implements the input check.
func (in CreateLease) Validate() error {
	if (in.Machine == "") == (in.Site == "") {
		return api.InvalidField("machine", "name a machine, or a site to lease any available machine of (one of them)")
	}
	for f, v := range map[string]string{"machine": in.Machine, "site": in.Site} {
		if v != "" {
			if err := api.ValidateRef(f, v); err != nil {
				return err
			}
		}
	}
	if err := api.ValidateRef("image", in.Image); err != nil {
		return err
	}
	if len(in.SSHKeys) == 0 {
		return api.InvalidField("sshKeys", "a lease hands the machine over to SSH keys: give at least one")
	}
	if err := validateSSHKeys(in.SSHKeys); err != nil {
		return err
	}
	if in.Duration != "" {
		d, err := api.ParseDuration("duration", in.Duration)
		if err != nil {
			return err
		}
		if d < time.Minute || d > MaxLeaseDuration {
			return api.InvalidField("duration", "must be between 1m and %s", MaxLeaseDuration)
		}
	}
	return nil
}

// LeaseRef names a lease.
type LeaseRef struct {
	TenantID string `json:"tenantId,omitempty"`
	Lease    string `json:"lease"`
}

// Validate implements the input check.
func (in LeaseRef) Validate() error {
	if uuid.Validate(in.Lease) != nil {
		return api.InvalidField("lease", "%q is not a lease's id", in.Lease)
	}
	return nil
}

// ListLeases is the input of leases.list.
type ListLeases struct {
	TenantID string `json:"tenantId,omitempty"`
	State    string `json:"state,omitempty"`
	api.PageRequest
}

// Validate implements the input check.
func (in ListLeases) Validate() error {
	return errors.Join(api.ValidateEnum("state", in.State, "deploying", "ready", "releasing", "ended", "failed"), in.PageRequest.Validate())
}

const leaseColumns = `id::text, tenant_id, machine_id::text, holder, image_id::text, ssh_keys, lower(during), upper(during), state, run_id, error, created_at, ended_at`

func scanLease(row pgx.Row) (Lease, error) {
	var l Lease
	err := row.Scan(&l.ID, &l.TenantID, &l.Machine, &l.Holder, &l.Image, &l.SSHKeys, &l.Start, &l.End, &l.State, &l.Run, &l.Error, &l.CreatedAt, &l.EndedAt)
	return l, err
}

func (m *Module) registerLeases(r *modules.Registry) {
	r.ResourceTypes(iam.ResourceType{Name: ResourceLease, Description: "A dedicated-root lease of a whole machine."})
	r.Actions(modules.ActionsFor(LeasesCreate.Info(), LeasesGet.Info(), LeasesList.Info(), LeasesEnd.Info())...)
	modules.Handle(r, LeasesCreate, nil, m.createLease)
	modules.Handle(r, LeasesGet, leaseTarget, func(ctx context.Context, c *modules.Call, in LeaseRef) (Lease, error) {
		return scanLease(c.Tx.QueryRow(ctx, `SELECT `+leaseColumns+` FROM compute.metal_leases WHERE id = $1`, in.Lease))
	})
	modules.Handle(r, LeasesList, nil, func(ctx context.Context, c *modules.Call, in ListLeases) (api.Page[Lease], error) {
		before, err := idCursor("ml1", in.Cursor)
		if err != nil {
			return api.Page[Lease]{}, err
		}
		limit := in.PageLimit()
		rows, err := c.Tx.Query(ctx, `SELECT `+leaseColumns+` FROM compute.metal_leases WHERE tenant_id = $1 AND ($2::uuid IS NULL OR id < $2)
			AND ($3 = '' OR state = $3) ORDER BY id DESC LIMIT $4`, c.Target.TenantID, before, in.State, limit+1)
		if err != nil {
			return api.Page[Lease]{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) { return scanLease(r) })
		if err != nil {
			return api.Page[Lease]{}, err
		}
		return api.PageOf(items, limit, "ml1", func(l Lease) string { return l.ID }), nil
	})
	modules.Handle(r, LeasesEnd, leaseTarget, func(ctx context.Context, c *modules.Call, in LeaseRef) (Lease, error) {
		return endLease(ctx, c.Tx, c.Runtime, in.Lease, c.Principal.ID)
	})
	r.Worker(modules.Worker{Name: "metal-leases", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, 15*time.Second, func() error { return endExpiredLeases(ctx, rt) })
	}})
}

func leaseTarget(ctx context.Context, l modules.Lookup, in LeaseRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "lease", Ref: in.Lease, ResourceID: in.Lease}
	err := l.Q.QueryRow(ctx, `SELECT tenant_id FROM compute.metal_leases WHERE id = $1`, in.Lease).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("lease", in.Lease)
	}
	return t, err
}

// createLease books the machine (the exclusion constraint refuses a second holder) and starts
// its deploy, in the call's transaction.
func (m *Module) createLease(ctx context.Context, c *modules.Call, in CreateLease) (Lease, error) {
	machine, err := m.leasableMachine(ctx, c, in)
	if err != nil {
		return Lease{}, err
	}
	img, err := imageRef(ctx, c.Tx, c.Target.TenantID, in.Image)
	if err != nil {
		return Lease{}, err
	}
	d := DefaultLeaseDuration
	if in.Duration != "" {
		d, _ = api.ParseDuration("duration", in.Duration)
	}
	id := uuid.Must(uuid.NewV7()).String()
	l, err := scanLease(c.Tx.QueryRow(ctx, `INSERT INTO compute.metal_leases (id, tenant_id, machine_id, holder, image_id, ssh_keys, during)
		VALUES ($1, $2, $3, $4, $5, $6, tstzrange(compute.compute_now(), compute.compute_now() + make_interval(secs => $7))) RETURNING `+leaseColumns,
		id, c.Target.TenantID, machine, c.Principal.ID, img.ID, in.SSHKeys, d.Seconds()))
	if postgres.ErrorCode(err) == postgres.ExclusionViolation {
		return l, api.Errorf(api.CodeConflict, "the machine is leased already").With("reason", "leased")
	}
	if err != nil {
		return l, err
	}
	dc := *c
	dc.Target = modules.Target{TenantID: c.Target.TenantID, ResourceID: machine, Existing: true, Kind: "machine", Ref: machine}
	run, err := m.deploy(ctx, &dc, DeployMachine{Machine: machine, Image: img.ID, SSHKeys: in.SSHKeys}, id)
	if err != nil {
		return l, err
	}
	return scanLease(c.Tx.QueryRow(ctx, `UPDATE compute.metal_leases SET run_id = $2 WHERE id = $1 RETURNING `+leaseColumns, id, run.Run))
}

// leasableMachine is the machine named, or an available one of the site named, locked.
func (m *Module) leasableMachine(ctx context.Context, c *modules.Call, in CreateLease) (string, error) {
	if in.Machine != "" {
		t, err := machineTarget(ctx, modules.Lookup{Q: c.Tx, Principal: c.Principal}, MachineRef{TenantID: c.Target.TenantID, Machine: in.Machine})
		if err != nil || t.TenantID != c.Target.TenantID {
			return "", api.NotFound("machine", in.Machine)
		}
		return t.ResourceID, nil
	}
	site, err := siteID(ctx, c.Tx, c.Target.TenantID, in.Site)
	if err != nil {
		return "", err
	}
	var id string
	err = c.Tx.QueryRow(ctx, `SELECT id::text FROM compute.metal_machines WHERE tenant_id = $1 AND site_id = $2 AND state = 'available'
		ORDER BY name LIMIT 1 FOR UPDATE SKIP LOCKED`, c.Target.TenantID, site).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", api.Errorf(api.CodeConflict, "site %s has no available machine", in.Site).With("reason", "no_machine")
	}
	return id, err
}

// endLease ends a lease now and releases its machine; a lease that ended already is a failed
// precondition.
func endLease(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, lease, by string) (Lease, error) {
	l, err := scanLease(tx.QueryRow(ctx, `UPDATE compute.metal_leases SET state = 'releasing',
		during = tstzrange(lower(during), greatest(lower(during) + interval '1 microsecond', least(upper(during), compute.compute_now())))
		WHERE id = $1 AND state IN ('deploying', 'ready') RETURNING `+leaseColumns, lease))
	if errors.Is(err, pgx.ErrNoRows) {
		var state string
		if err := tx.QueryRow(ctx, `SELECT state FROM compute.metal_leases WHERE id = $1`, lease).Scan(&state); err != nil {
			return l, err
		}
		return l, api.Errorf(api.CodeFailedPrecondition, "the lease is %s already", state).With("reason", state)
	}
	if err != nil {
		return l, err
	}
	// A deploy still running is cancelled first: its end marks the machine failed, and the
	// release wipes it from there.
	var deploying bool
	if err := tx.QueryRow(ctx, `SELECT state = 'deploying' FROM compute.metal_machines WHERE id = $1`, l.Machine).Scan(&deploying); err != nil {
		return l, err
	}
	if deploying && l.Run != "" {
		if err := rt.Workflows.Cancel(ctx, tx, l.Run); err != nil && api.CodeOf(err) != api.CodeFailedPrecondition {
			return l, err
		}
	}
	run, err := release(ctx, tx, rt, l.Machine, by, l.ID)
	if api.CodeOf(err) == api.CodeFailedPrecondition {
		// The machine cannot be released now (it lost its site, say): the lease has ended all
		// the same, failed, with why; the machine is the operator's to release.
		return scanLease(tx.QueryRow(ctx, `UPDATE compute.metal_leases SET state = 'failed', error = $2, ended_at = compute.compute_now()
			WHERE id = $1 RETURNING `+leaseColumns, l.ID, "release: "+err.Error()))
	}
	if err != nil {
		return l, err
	}
	return scanLease(tx.QueryRow(ctx, `UPDATE compute.metal_leases SET run_id = $2, state = 'releasing' WHERE id = $1 RETURNING `+leaseColumns, l.ID, run.Run))
}

// endExpiredLeases ends the leases whose time is up, each in its own transaction.
func endExpiredLeases(ctx context.Context, rt *modules.Runtime) error {
	for {
		done := false
		err := rt.DB.Tx(ctx, func(tx pgx.Tx) error {
			var id string
			err := tx.QueryRow(ctx, `SELECT id::text FROM compute.metal_leases WHERE state IN ('deploying', 'ready') AND upper(during) <= compute.compute_now()
				ORDER BY upper(during) LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			_, err = endLease(ctx, tx, rt, id, "metal-leases")
			return err
		})
		if err != nil || done {
			return err
		}
	}
}
