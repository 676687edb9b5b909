package metal

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// The join requests' methods.
var (
	JoinRequestsList    = api.NewMethod[ListJoinRequests, api.Page[JoinRequest]]("joinRequests", "list", false, ResourceMachine, "v0.4", "List the machines that appeared at a site and wait to be approved.")
	JoinRequestsApprove = api.NewMethod[ApproveJoinRequest, Machine]("joinRequests", "approve", true, ResourceMachine, "v0.4", "Enroll a machine that asked to join, with its BMC credentials (write-only).")
	JoinRequestsReject  = api.NewMethod[RejectJoinRequest, JoinRequest]("joinRequests", "reject", true, ResourceMachine, "v0.4", "Refuse a machine that asked to join.")
)

// The join requests' events; the subject of each is the request.
const (
	EventJoinRequested = "metal.join_requested"
	EventJoinApproved  = "metal.join_approved"
	EventJoinRejected  = "metal.join_rejected"
)

// Facts are what a machine's ramdisk reports of it (siteapi's, shared with bcd site and bcd
// ramdisk): untrusted input, checked by checkFacts.
type Facts = siteapi.Facts

// checkFacts validates facts a site reported, as an api error naming the field.
func checkFacts(f Facts) error {
	var fe *siteapi.FieldError
	if err := f.Validate(); errors.As(err, &fe) {
		return api.InvalidField(fe.Field, "%s", fe.Problem)
	} else if err != nil {
		return api.InvalidField("facts", "%v", err)
	}
	return nil
}

// JoinRequest is a machine that asked to join.
type JoinRequest struct {
	ID        string     `json:"id"`
	TenantID  string     `json:"tenantId"`
	Site      string     `json:"site"`
	Facts     Facts      `json:"facts"`
	State     string     `json:"state"` // pending, approved, rejected
	MachineID string     `json:"machineId,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	DecidedBy string     `json:"decidedBy,omitempty"`
	DecidedAt *time.Time `json:"decidedAt,omitempty"`
	SeenAt    time.Time  `json:"seenAt"` // the last time the machine asked
	CreatedAt time.Time  `json:"createdAt"`
}

// ListJoinRequests is the input of joinRequests.list.
type ListJoinRequests struct {
	TenantID string `json:"tenantId,omitempty"`
	State    string `json:"state,omitempty"`
	api.PageRequest
}

// Validate implements the input check.
func (in ListJoinRequests) Validate() error {
	return errors.Join(api.ValidateEnum("state", in.State, "pending", "approved", "rejected"), in.PageRequest.Validate())
}

// ApproveJoinRequest is the input of joinRequests.approve: the request becomes a machine of
// this name, reached through this BMC, provisioned with this profile, at the site it appeared
// at, booting from the MACs it reported.
//
// Or, with Machine, the request is the machine of that name or id, registered before by its BMC
// alone (a machine racked and powered on through its BMC, whose ramdisk then asked to join): it
// is given the request's facts and MACs.
type ApproveJoinRequest struct {
	TenantID string   `json:"tenantId,omitempty"`
	Request  string   `json:"request"`
	Name     string   `json:"name,omitempty"`
	BMC      BMCInput `json:"bmc,omitzero"`
	Profile  string   `json:"profile,omitempty"` // default: pxe-<the BMC's driver>
	Machine  string   `json:"machine,omitempty"`
}

// Validate implements the input check.
func (in ApproveJoinRequest) Validate() error {
	if uuid.Validate(in.Request) != nil {
		return api.InvalidField("request", "%q is not a join request's id", in.Request)
	}
	if in.Machine != "" {
		if in.Name != "" || in.BMC != (BMCInput{}) || in.Profile != "" {
			return api.InvalidField("machine", "an existing machine has its name, BMC and profile: give the machine, or a name and a BMC, not both")
		}
		return api.ValidateRef("machine", in.Machine)
	}
	if err := api.ValidateName("name", in.Name); err != nil {
		return err
	}
	if err := validatePlacement("", in.Profile, nil); err != nil {
		return err
	}
	return in.BMC.Validate()
}

// RejectJoinRequest is the input of joinRequests.reject.
type RejectJoinRequest struct {
	TenantID string `json:"tenantId,omitempty"`
	Request  string `json:"request"`
	Reason   string `json:"reason,omitempty"`
}

// Validate implements the input check.
func (in RejectJoinRequest) Validate() error {
	if uuid.Validate(in.Request) != nil {
		return api.InvalidField("request", "%q is not a join request's id", in.Request)
	}
	return api.ValidateText("reason", in.Reason, api.MaxDescription)
}

const requestColumns = `id::text, tenant_id, site, facts, state, coalesce(machine_id::text, ''), reason, decided_by, decided_at, seen_at, created_at`

func scanRequest(row pgx.Row) (JoinRequest, error) {
	var r JoinRequest
	err := row.Scan(&r.ID, &r.TenantID, &r.Site, &r.Facts, &r.State, &r.MachineID, &r.Reason, &r.DecidedBy, &r.DecidedAt, &r.SeenAt, &r.CreatedAt)
	return r, err
}

// SubmitJoinRequest records that a machine not known yet asked to join at site (its id or name),
// with its facts, in tx: a new pending request (and its event), or the machine's pending one
// refreshed. A site agent's report of an unknown machine (siteapi.KindMachineSeen) lands here.
func SubmitJoinRequest(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, tenant, site string, f Facts) (JoinRequest, error) {
	if err := checkFacts(f); err != nil {
		return JoinRequest{}, err
	}
	if site == "" || len(site) > 253 {
		return JoinRequest{}, api.InvalidField("site", "is required")
	}
	var created bool
	var r JoinRequest
	err := tx.QueryRow(ctx, `INSERT INTO compute.metal_join_requests (id, tenant_id, site, serial, facts) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (tenant_id, serial) WHERE state = 'pending' DO UPDATE SET facts = excluded.facts, site = excluded.site, seen_at = compute.compute_now()
		RETURNING (xmax = 0), `+requestColumns, uuid.Must(uuid.NewV7()).String(), tenant, site, f.Serial, f).
		Scan(&created, &r.ID, &r.TenantID, &r.Site, &r.Facts, &r.State, &r.MachineID, &r.Reason, &r.DecidedBy, &r.DecidedAt, &r.SeenAt, &r.CreatedAt)
	if err != nil || !created {
		return r, err
	}
	return r, rt.Events.Emit(ctx, tx, modules.Event{Type: EventJoinRequested, TenantID: tenant, Subject: r.ID,
		Data: map[string]any{"site": site, "serial": f.Serial, "macs": f.MACs}})
}

func (m *Module) registerJoinRequests(r *modules.Registry) {
	r.Actions(modules.ActionsFor(JoinRequestsList.Info(), JoinRequestsApprove.Info(), JoinRequestsReject.Info())...)
	r.EventTypes(
		modules.EventType{Name: EventJoinRequested, Description: "A machine not known yet asked to join at a site (data: site, serial, macs)."},
		modules.EventType{Name: EventJoinApproved, Description: "A join request was approved: the machine is enrolled (data: machine)."},
		modules.EventType{Name: EventJoinRejected, Description: "A join request was rejected (data: reason)."},
	)
	modules.Handle(r, JoinRequestsList, nil, func(ctx context.Context, c *modules.Call, in ListJoinRequests) (api.Page[JoinRequest], error) {
		before, err := idCursor("jr1", in.Cursor)
		if err != nil {
			return api.Page[JoinRequest]{}, err
		}
		limit := in.PageLimit()
		rows, err := c.Tx.Query(ctx, `SELECT `+requestColumns+` FROM compute.metal_join_requests WHERE tenant_id = $1
			AND ($2::uuid IS NULL OR id < $2) AND ($3 = '' OR state = $3) ORDER BY id DESC LIMIT $4`, c.Target.TenantID, before, in.State, limit+1)
		if err != nil {
			return api.Page[JoinRequest]{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JoinRequest, error) { return scanRequest(r) })
		if err != nil {
			return api.Page[JoinRequest]{}, err
		}
		return api.PageOf(items, limit, "jr1", func(r JoinRequest) string { return r.ID }), nil
	})
	modules.Handle(r, JoinRequestsApprove, func(ctx context.Context, l modules.Lookup, in ApproveJoinRequest) (modules.Target, error) {
		return requestTarget(ctx, l.Q, in.Request)
	}, approve)
	modules.Handle(r, JoinRequestsReject, func(ctx context.Context, l modules.Lookup, in RejectJoinRequest) (modules.Target, error) {
		return requestTarget(ctx, l.Q, in.Request)
	}, func(ctx context.Context, c *modules.Call, in RejectJoinRequest) (JoinRequest, error) {
		req, err := decide(ctx, c, in.Request, "rejected", "", in.Reason)
		if err != nil {
			return req, err
		}
		return req, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventJoinRejected, TenantID: req.TenantID, Subject: req.ID,
			Data: map[string]any{"reason": in.Reason}})
	})
}

// adopt makes a registered machine the one a join request reported: it is at the request's site
// and boots from its MACs.
func adopt(ctx context.Context, c *modules.Call, ref, site string, macs []string) (Machine, error) {
	t, err := machineTarget(ctx, modules.Lookup{Q: c.Tx, Principal: c.Principal}, MachineRef{TenantID: c.Target.TenantID, Machine: ref})
	if err != nil || t.TenantID != c.Target.TenantID {
		return Machine{}, api.InvalidField("machine", "the tenant has no machine %q", ref)
	}
	siteID, err := siteID(ctx, c.Tx, c.Target.TenantID, site)
	if err != nil {
		return Machine{}, err
	}
	var old *string
	if err := c.Tx.QueryRow(ctx, `SELECT site_id::text FROM (SELECT site_id FROM compute.metal_machines WHERE id = $1 FOR UPDATE) m`, t.ResourceID).Scan(&old); err != nil {
		return Machine{}, err
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.metal_machines SET site_id = $2 WHERE id = $1`, t.ResourceID, siteID); err != nil {
		return Machine{}, err
	}
	if err := setMACs(ctx, c.Tx, t.ResourceID, macs); err != nil {
		return Machine{}, err
	}
	for _, s := range []*string{old, &siteID} {
		if s != nil {
			if err := bumpSite(ctx, c.Tx, c.Runtime, *s); err != nil {
				return Machine{}, err
			}
		}
	}
	return getMachine(ctx, c.Tx, t.ResourceID)
}

// idCursor decodes the cursor of a list ordered by id, newest first: the id to list before, or
// nil for the first page.
func idCursor(kind, cursor string) (*string, error) {
	if cursor == "" {
		return nil, nil
	}
	key, err := api.DecodeIDCursor(kind, cursor)
	if err != nil {
		return nil, err
	}
	return &key, nil
}

func requestTarget(ctx context.Context, q postgres.Querier, id string) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "join request", Ref: id, ResourceID: id}
	err := q.QueryRow(ctx, `SELECT tenant_id FROM compute.metal_join_requests WHERE id = $1`, id).Scan(&t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("join request", id)
	}
	return t, err
}

// decide moves a pending request to state; one decided already is a failed precondition.
func decide(ctx context.Context, c *modules.Call, id, state, machine, reason string) (JoinRequest, error) {
	var m *string
	if machine != "" {
		m = &machine
	}
	req, err := scanRequest(c.Tx.QueryRow(ctx, `UPDATE compute.metal_join_requests SET state = $2, machine_id = $3, reason = $4,
		decided_by = $5, decided_at = compute.compute_now() WHERE id = $1 AND state = 'pending' RETURNING `+requestColumns,
		id, state, m, reason, c.Principal.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		var cur string
		if err := c.Tx.QueryRow(ctx, `SELECT state FROM compute.metal_join_requests WHERE id = $1`, id).Scan(&cur); err != nil {
			return req, err
		}
		return req, api.Errorf(api.CodeFailedPrecondition, "the join request was %s already", cur).With("reason", "decided")
	}
	return req, err
}

// approve enrolls the machine: a machine row with the request's facts, site and MACs and the
// BMC given, and the request approved, in the call's one transaction.
func approve(ctx context.Context, c *modules.Call, in ApproveJoinRequest) (Machine, error) {
	var facts Facts
	var site, state string
	if err := c.Tx.QueryRow(ctx, `SELECT facts, site, state FROM compute.metal_join_requests WHERE id = $1 FOR UPDATE`, in.Request).Scan(&facts, &site, &state); err != nil {
		return Machine{}, err
	}
	if state != "pending" {
		return Machine{}, api.Errorf(api.CodeFailedPrecondition, "the join request was %s already", state).With("reason", "decided")
	}
	// The machine is the site's where it appeared, and boots from the MACs it reported.
	var m Machine
	var err error
	if in.Machine != "" {
		m, err = adopt(ctx, c, in.Machine, site, facts.MACs)
	} else {
		m, err = createMachine(ctx, c, CreateMachine{Name: in.Name, BMC: in.BMC, Site: site, Profile: in.Profile, MACs: facts.MACs})
	}
	if err != nil {
		return m, err
	}
	if m, err = scanMachine(c.Tx.QueryRow(ctx, `UPDATE compute.metal_machines SET facts = $2 WHERE id = $1 RETURNING `+machineColumns, m.ID, facts)); err != nil {
		return m, err
	}
	if _, err := decide(ctx, c, in.Request, "approved", m.ID, ""); err != nil {
		return m, err
	}
	return m, c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: EventJoinApproved, TenantID: m.TenantID, Subject: in.Request,
		Data: map[string]any{"machine": m.ID, "name": m.Name}})
}
