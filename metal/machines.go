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
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the module's schema.
var Migrations = postgres.EmbeddedMigrations("metal", "compute", migrationsFS)

// PowerWorkflow carries out machines.power: the action through the machine's BMC, then a wait
// for the power state it should lead to, recorded on the machine with an event.
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
	modules.Handle(r, MachinesDelete, machineTarget, func(ctx context.Context, c *modules.Call, _ MachineRef) (Machine, error) {
		return scanMachine(c.Tx.QueryRow(ctx, `DELETE FROM compute.metal_machines WHERE id = $1 RETURNING `+machineColumns, c.Target.ResourceID))
	})
	r.Workflow(modules.Workflow{Name: PowerWorkflow, Steps: []modules.Step{
		{Name: "act", Timeout: 2 * time.Minute, MaxAttempts: 3, Run: powerAct},
		{Name: "check", Timeout: 2 * time.Minute, Deadline: powerDeadline, Run: powerCheck},
	}})
	m.registerImages(r)
	m.registerJoinRequests(r)
}

const machineColumns = `id::text, tenant_id, name, bmc_driver, bmc_address, bmc_username, facts, power, power_checked_at, created_by, created_at`

func scanMachine(row pgx.Row) (Machine, error) {
	var m Machine
	err := row.Scan(&m.ID, &m.TenantID, &m.Name, &m.BMC.Driver, &m.BMC.Address, &m.BMC.Username, &m.Facts, &m.Power, &m.PowerCheckedAt, &m.CreatedBy, &m.CreatedAt)
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

func createMachine(ctx context.Context, c *modules.Call, in CreateMachine) (Machine, error) {
	if err := checkBMC(c.Runtime.Registry, in.BMC); err != nil {
		return Machine{}, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	sealed, err := c.Runtime.Secrets.Seal(purpose(id), []byte(in.BMC.Password))
	if err != nil {
		return Machine{}, err
	}
	m, err := scanMachine(c.Tx.QueryRow(ctx, `INSERT INTO compute.metal_machines (id, tenant_id, name, bmc_driver, bmc_address, bmc_username, bmc_password, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (tenant_id, name) DO NOTHING RETURNING `+machineColumns,
		id, c.Target.TenantID, in.Name, in.BMC.Driver, in.BMC.Address, in.BMC.Username, sealed, c.Principal.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return m, api.Errorf(api.CodeConflict, "the tenant has a machine named %q", in.Name).With("reason", "name_taken")
	}
	return m, err
}

func setBMC(ctx context.Context, c *modules.Call, in SetMachineBMC) (Machine, error) {
	if err := checkBMC(c.Runtime.Registry, in.BMC); err != nil {
		return Machine{}, err
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
	run, err := c.Runtime.Workflows.Start(ctx, c.Tx, modules.StartWorkflow{Workflow: PowerWorkflow, TenantID: m.TenantID, Subject: m.ID,
		Input: powerInput{Machine: m.ID, Action: in.Action}, CreatedBy: c.Principal.ID})
	return PowerRun{Run: run, Machine: m}, err
}

// bmcOf reads a machine's BMC, its password opened, and its driver.
func bmcOf(ctx context.Context, rt *modules.Runtime, id string) (power.Driver, power.BMC, error) {
	var driver string
	var b power.BMC
	var sealed []byte
	err := rt.DB.Pool.QueryRow(ctx, `SELECT bmc_driver, bmc_address, bmc_username, bmc_password FROM compute.metal_machines WHERE id = $1`, id).
		Scan(&driver, &b.Address, &b.Username, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, b, modules.Permanent(fmt.Errorf("machine %s is gone", id))
	}
	if err != nil {
		return nil, b, err
	}
	pw, err := rt.Secrets.Open(purpose(id), sealed)
	if err != nil {
		return nil, b, modules.Permanent(fmt.Errorf("open the BMC password of machine %s: %w", id, err))
	}
	b.Password = string(pw)
	d, err := PowerDriver(rt.Registry, driver)
	if err != nil {
		return nil, b, modules.Permanent(err)
	}
	return d, b, nil
}

func powerAct(ctx context.Context, s *modules.StepRun) (any, error) {
	var in powerInput
	if err := json.Unmarshal(s.Input, &in); err != nil {
		return nil, modules.Permanent(err)
	}
	d, b, err := bmcOf(ctx, s.Runtime, in.Machine)
	if err != nil {
		return nil, err
	}
	return nil, d.Set(ctx, b, power.Action(in.Action))
}

func powerCheck(ctx context.Context, s *modules.StepRun) (any, error) {
	var in powerInput
	if err := json.Unmarshal(s.Input, &in); err != nil {
		return nil, modules.Permanent(err)
	}
	want := power.On
	if slices.Contains([]string{"off", "soft"}, in.Action) {
		want = power.Off
	}
	d, b, err := bmcOf(ctx, s.Runtime, in.Machine)
	if err != nil {
		return nil, err
	}
	got, err := d.State(ctx, b)
	if err != nil {
		return nil, err
	}
	if got != want {
		return nil, modules.Wait(time.Second, fmt.Sprintf("the machine is %s; waiting for it to be %s", got, want))
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
