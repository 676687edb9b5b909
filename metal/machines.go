package metal

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the module's schema.
var Migrations = postgres.EmbeddedMigrations("metal", "compute", migrationsFS)

// PowerWorkflow carries out machines.power: the action through the machine's BMC (by its site's
// agent, for a machine of a site), then a wait for the power state it should lead to, recorded
// on the machine with an event.
const PowerWorkflow = "metal.power"

// EventPower is the event of a machine's power read after an action (data: action, power).
const EventPower = "metal.machine_power"

// powerDeadline bounds the wait for a machine to reach its power state (a soft shutdown is the
// operating system's to finish).
const powerDeadline = 10 * time.Minute

func (m *Module) registerMachines(r *modules.Registry) {
	r.Migrations(Migrations)
	r.ResourceTypes(
		iam.ResourceType{Name: ResourceMachine, Description: "A machine reached through its BMC."},
		iam.ResourceType{Name: ResourceImage, Description: "An image machines are deployed with."},
	)
	r.Actions(modules.ActionsFor(Methods()...)...)
	r.EventTypes(modules.EventType{Name: EventPower, Description: "A machine's power was read after machines.power acted on it (data: action, power)."})
	modules.Handle(r, MachinesCreate, nil, createMachine)
	modules.Handle(r, MachinesGet, machineTarget, func(ctx context.Context, c *modules.Call, _ MachineRef) (Machine, error) {
		return getMachine(ctx, c.Tx, c.Target.ResourceID)
	})
	modules.Handle(r, MachinesList, nil, listMachines)
	modules.Handle(r, MachinesSetBMC, func(ctx context.Context, l modules.Lookup, in SetMachineBMC) (modules.Target, error) {
		return machineTarget(ctx, l, MachineRef{TenantID: in.TenantID, Machine: in.Machine})
	}, setBMC)
	modules.Handle(r, MachinesPower, func(ctx context.Context, l modules.Lookup, in PowerMachine) (modules.Target, error) {
		return machineTarget(ctx, l, MachineRef{TenantID: in.TenantID, Machine: in.Machine})
	}, powerMachine)
	modules.Handle(r, MachinesDelete, machineTarget, deleteMachine)
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: PowerWorkflow, Steps: []provision.Step[*modules.Runtime]{
		{Name: "act", Timeout: 2 * time.Minute, MaxAttempts: 3, Run: powerAct},
		{Name: "check", Timeout: 2 * time.Minute, Deadline: powerDeadline, Run: powerCheck},
	}})
	m.registerImages(r)
	m.registerJoinRequests(r)
}

// machineColumns reads a machine with its MACs and its task's last progress (subqueries, so
// that they also serve in RETURNING).
const machineColumns = `id::text, tenant_id, name, bmc_driver, bmc_address, bmc_username, coalesce(site_id::text, ''), profile,
	(SELECT coalesce(array_agg(x.mac ORDER BY x.mac), '{}') FROM compute.metal_macs x WHERE x.machine_id = id), state,
	coalesce(image_id::text, ''), coalesce(node_id::text, ''),
	CASE WHEN task IS NOT NULL THEN jsonb_build_object('id', task->>'id', 'kind', task->>'kind') || coalesce((SELECT jsonb_build_object('phase', p.phase,
	  'bytes', p.bytes, 'total', p.total, 'error', p.error, 'updatedAt', p.updated_at) FROM compute.metal_task_progress p WHERE p.task_id = task->>'id'), '{}') END,
	facts, seen_at, power, power_checked_at, created_by, created_at`

func scanMachine(row pgx.Row) (Machine, error) {
	var m Machine
	err := row.Scan(&m.ID, &m.TenantID, &m.Name, &m.BMC.Driver, &m.BMC.Address, &m.BMC.Username, &m.Site, &m.Profile, &m.MACs, &m.State,
		&m.Image, &m.NodeID, &m.Task, &m.Facts, &m.SeenAt, &m.Power, &m.PowerCheckedAt, &m.CreatedBy, &m.CreatedAt)
	m.BMC.PasswordSet = err == nil // every stored machine has one; it is never read back
	return m, err
}

func getMachine(ctx context.Context, q postgres.Querier, id string) (Machine, error) {
	m, err := scanMachine(q.QueryRow(ctx, `SELECT `+machineColumns+` FROM compute.metal_machines WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return m, api.NotFound("machine", id)
	}
	return m, err
}

func machineTarget(ctx context.Context, l modules.Lookup, in MachineRef) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: "machine", Ref: in.Machine}
	tenant := modules.TenantTarget(l.Principal, in.TenantID).TenantID
	err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.metal_machines WHERE id::text = $1 OR (tenant_id = $2 AND name = $1)
		ORDER BY (id::text = $1) DESC LIMIT 1`, in.Machine, tenant).Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound("machine", in.Machine)
	}
	return t, err
}

// purpose binds a machine's sealed BMC password to it.
func purpose(machineID string) string { return "metal-bmc:" + machineID }

// checkBMC refuses a driver nobody registered, and an address its driver cannot dial.
func checkBMC(reg *modules.Registry, b BMCInput) error {
	if _, err := PowerDriver(reg, b.Driver); err != nil {
		return api.InvalidField("bmc.driver", "no power driver %q is registered here", b.Driver)
	}
	switch b.Driver {
	case "ipmi":
		if _, _, err := net.SplitHostPort(b.Address); err != nil {
			return api.InvalidField("bmc.address", "%q: an IPMI BMC is host:port (623 is IPMI's)", b.Address)
		}
	case "redfish":
		if u, err := url.Parse(b.Address); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return api.InvalidField("bmc.address", "%q: a Redfish BMC is its service's URL (https://host)", b.Address)
		}
	}
	return nil
}

// checkDialled checks the BMC address of a machine with no site, which the control plane
// dials itself, against the outbound policy (a site's agent dials its own site's BMCs).
//
// Redfish's address is a URL, IPMI's host:port; another driver's is read as either, or else as
// a host, and refused only when it is an address the policy refuses: the driver dials through
// power.BMC.Dial, which checks every connection.
func checkDialled(p *netpolicy.Policy, b BMCInput) error {
	var err error
	host, _, splitErr := net.SplitHostPort(b.Address)
	switch {
	case b.Driver == "redfish" || strings.Contains(b.Address, "://"):
		err = p.CheckURL(b.Address)
	case splitErr == nil:
		err = p.CheckHost(host)
	default:
		if err = p.CheckHost(b.Address); errors.Is(err, netpolicy.ErrNotHost) {
			err = nil
		}
	}
	if err != nil {
		return api.InvalidField("bmc.address", "%v: the control plane dials the BMC of a machine with no site itself, at a public address only "+
			"(an operator may allow the BMCs' range: Options.Outbound.Allow; or give the machine a site, whose agent dials it)", err).
			With("reason", "refused_by_outbound_policy")
	}
	return nil
}

func createMachine(ctx context.Context, c *modules.Call, in CreateMachine) (Machine, error) {
	if err := checkBMC(c.Runtime.Registry, in.BMC); err != nil {
		return Machine{}, err
	}
	profile, err := profileFor(c.Runtime.Registry, in.Profile, in.BMC.Driver)
	if err != nil {
		return Machine{}, err
	}
	var site *string
	if in.Site != "" {
		id, err := siteID(ctx, c.Tx, c.Target.TenantID, in.Site)
		if err != nil {
			return Machine{}, err
		}
		site = &id
	} else if err := checkDialled(c.Runtime.Outbound, in.BMC); err != nil {
		return Machine{}, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	sealed, err := c.Runtime.Secrets.Seal(purpose(id), []byte(in.BMC.Password))
	if err != nil {
		return Machine{}, err
	}
	tag, err := c.Tx.Exec(ctx, `INSERT INTO compute.metal_machines (id, tenant_id, name, bmc_driver, bmc_address, bmc_username, bmc_password, created_by, site_id, profile)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (tenant_id, name) DO NOTHING`,
		id, c.Target.TenantID, in.Name, in.BMC.Driver, in.BMC.Address, in.BMC.Username, sealed, c.Principal.ID, site, profile)
	if err != nil {
		return Machine{}, err
	}
	if tag.RowsAffected() == 0 {
		return Machine{}, api.Errorf(api.CodeConflict, "the tenant has a machine named %q", in.Name).With("reason", "name_taken")
	}
	if err := setMACs(ctx, c.Tx, id, in.MACs); err != nil {
		return Machine{}, err
	}
	if site != nil {
		if err := bumpSite(ctx, c.Tx, c.Runtime, *site); err != nil {
			return Machine{}, err
		}
	}
	return getMachine(ctx, c.Tx, id)
}

// siteID finds a site of the tenant by id or name. Sites are the core's (sites.create); the
// module only refers to them.
func siteID(ctx context.Context, q postgres.Querier, tenant, ref string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id::text FROM compute.sites WHERE tenant_id = $1 AND (id::text = $2 OR name = $2)`, tenant, ref).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", api.NotFound("site", ref)
	}
	return id, err
}

// setMACs gives a machine its MACs. A MAC is one machine's: another's is a conflict.
func setMACs(ctx context.Context, tx pgx.Tx, machine string, macs []string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM compute.metal_macs WHERE machine_id = $1`, machine); err != nil {
		return err
	}
	var taken string
	err := tx.QueryRow(ctx, `WITH ins AS (INSERT INTO compute.metal_macs (mac, machine_id) SELECT DISTINCT unnest($2::text[]), $1::uuid
		ON CONFLICT (mac) DO NOTHING RETURNING mac)
		SELECT m FROM unnest($2::text[]) m WHERE m NOT IN (SELECT mac FROM ins) LIMIT 1`, machine, macs).Scan(&taken)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return api.Errorf(api.CodeConflict, "MAC %s is another machine's", taken).With("reason", "mac_taken")
}

// deleteMachine forgets a machine that is not deployed, leased or being worked on.
func deleteMachine(ctx context.Context, c *modules.Call, _ MachineRef) (Machine, error) {
	m, err := getMachine(ctx, c.Tx, c.Target.ResourceID)
	if err != nil {
		return m, err
	}
	if m.State != StateAvailable && m.State != StateFailed {
		return m, api.Errorf(api.CodeFailedPrecondition, "machine %s is %s: release it first", m.Name, m.State).With("reason", m.State)
	}
	if _, err := c.Tx.Exec(ctx, `DELETE FROM compute.metal_machines WHERE id = $1`, m.ID); err != nil {
		if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
			return m, api.Errorf(api.CodeFailedPrecondition, "machine %s has leases on record", m.Name).With("reason", "leased")
		}
		return m, err
	}
	if m.Site != "" {
		return m, bumpSite(ctx, c.Tx, c.Runtime, m.Site)
	}
	return m, nil
}

func setBMC(ctx context.Context, c *modules.Call, in SetMachineBMC) (Machine, error) {
	if err := checkBMC(c.Runtime.Registry, in.BMC); err != nil {
		return Machine{}, err
	}
	var site *string
	if err := c.Tx.QueryRow(ctx, `SELECT site_id::text FROM compute.metal_machines WHERE id = $1 FOR UPDATE`, c.Target.ResourceID).Scan(&site); err != nil {
		return Machine{}, err
	}
	if site == nil {
		if err := checkDialled(c.Runtime.Outbound, in.BMC); err != nil {
			return Machine{}, err
		}
	}
	sealed, err := c.Runtime.Secrets.Seal(purpose(c.Target.ResourceID), []byte(in.BMC.Password))
	if err != nil {
		return Machine{}, err
	}
	return scanMachine(c.Tx.QueryRow(ctx, `UPDATE compute.metal_machines SET bmc_driver = $2, bmc_address = $3, bmc_username = $4, bmc_password = $5,
		power = 'unknown', power_checked_at = NULL WHERE id = $1 RETURNING `+machineColumns,
		c.Target.ResourceID, in.BMC.Driver, in.BMC.Address, in.BMC.Username, sealed))
}

const machineCursor = "mm1"

func listMachines(ctx context.Context, c *modules.Call, in ListMachines) (api.Page[Machine], error) {
	after := ""
	if in.Cursor != "" {
		key, err := api.DecodeCursor(machineCursor, in.Cursor)
		if err != nil {
			return api.Page[Machine]{}, err
		}
		after = key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+machineColumns+` FROM compute.metal_machines WHERE tenant_id = $1 AND name > $2 ORDER BY name LIMIT $3`,
		c.Target.TenantID, after, limit+1)
	if err != nil {
		return api.Page[Machine]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Machine, error) { return scanMachine(r) })
	if err != nil {
		return api.Page[Machine]{}, err
	}
	return api.PageOf(items, limit, machineCursor, func(m Machine) string { return m.Name }), nil
}

// powerInput is a power run's input.
type powerInput struct {
	Machine string `json:"machine"`
	Action  string `json:"action"`
}

func powerMachine(ctx context.Context, c *modules.Call, in PowerMachine) (PowerRun, error) {
	m, err := getMachine(ctx, c.Tx, c.Target.ResourceID)
	if err != nil {
		return PowerRun{}, err
	}
	run, err := c.Runtime.Workflows.Start(ctx, c.Tx, provision.StartWorkflow{Workflow: PowerWorkflow, TenantID: m.TenantID, Subject: m.ID,
		Input: powerInput{Machine: m.ID, Action: in.Action}, CreatedBy: c.Principal.ID})
	return PowerRun{Run: run, Machine: m}, err
}

func powerAct(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	var in powerInput
	if err := json.Unmarshal(s.Input, &in); err != nil {
		return nil, provision.Permanent(err)
	}
	_, err := bmcOps(ctx, s, in.Machine, []power.Op{{Op: power.OpPower, Action: power.Action(in.Action)}})
	return nil, err
}

func powerCheck(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	var in powerInput
	if err := json.Unmarshal(s.Input, &in); err != nil {
		return nil, provision.Permanent(err)
	}
	want := power.On
	if slices.Contains([]string{"off", "soft"}, in.Action) {
		want = power.Off
	}
	out, err := bmcOps(ctx, s, in.Machine, []power.Op{{Op: power.OpState}})
	if err != nil {
		return nil, err
	}
	got := out.Power
	if got != want {
		return nil, provision.Wait(time.Second, fmt.Sprintf("the machine is %s; waiting for it to be %s", got, want))
	}
	err = s.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE compute.metal_machines SET power = $2, power_checked_at = compute.compute_now() WHERE id = $1`, in.Machine, string(got)); err != nil {
			return err
		}
		return s.Runtime.Events.Emit(ctx, tx, modules.Event{Type: EventPower, TenantID: s.TenantID, Subject: in.Machine,
			Data: map[string]any{"action": in.Action, "power": string(got)}})
	})
	return map[string]string{"power": string(got)}, err
}
