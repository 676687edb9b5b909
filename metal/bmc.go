package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

// CommandBMC is the command kind a site agent carries out for the control plane: a sequence of
// operations on a BMC of its site (power.Run), the password travelling as the command's
// write-only secret.
const CommandBMC = power.Command

// BMCArgs are the arguments of a metal.bmc command; its secret is BMCSecret.
type BMCArgs = power.CommandArgs

// BMCSecret is a metal.bmc command's secret.
type BMCSecret = power.CommandSecret

func checkBMCArgs(_ context.Context, _ postgres.Querier, _ string, raw json.RawMessage) error {
	var a BMCArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return api.InvalidField("args", "not the arguments of metal.bmc: %v", err)
	}
	if a.Driver == "" || a.Address == "" || len(a.Ops) == 0 {
		return api.InvalidField("args", "metal.bmc needs a driver, an address and operations")
	}
	for i, o := range a.Ops {
		if err := o.Validate(); err != nil {
			return api.InvalidField(fmt.Sprintf("args.ops[%d]", i), "%v", err)
		}
	}
	return nil
}

// bmcOps carries out ops on a machine's BMC for a workflow step: through the machine's site
// agent (a metal.bmc command, waited for) when it has a site, else here, with the driver. Run
// again, the step finds the command its attempt queued rather than queueing another, so that an
// action is not taken twice; a read (only OpState) is forgotten once answered, so that a step
// polling the power reads it afresh each time.
func bmcOps(ctx context.Context, s *provision.StepRun[*modules.Runtime], machine string, ops []power.Op) (power.Outcome, error) {
	rt := s.Runtime
	var site *string
	var driver, address, username string
	var sealed []byte
	err := rt.DB.Pool.QueryRow(ctx, `SELECT site_id::text, bmc_driver, bmc_address, bmc_username, bmc_password FROM compute.metal_machines WHERE id = $1`, machine).
		Scan(&site, &driver, &address, &username, &sealed)
	if errors.Is(err, pgx.ErrNoRows) {
		return power.Outcome{}, provision.Permanent(fmt.Errorf("machine %s is gone", machine))
	}
	if err != nil {
		return power.Outcome{}, err
	}
	pw, err := rt.Secrets.Open(purpose(machine), sealed)
	if err != nil {
		return power.Outcome{}, provision.Permanent(fmt.Errorf("open the BMC password of machine %s: %w", machine, err))
	}
	if site == nil {
		d, err := PowerDriver(rt.Registry, driver)
		if err != nil {
			return power.Outcome{}, provision.Permanent(err)
		}
		// The control plane dials the BMC itself: through the outbound policy, which checks
		// every connection's address (the address was checked when it was set, too).
		out, err := power.Run(ctx, d, power.BMC{Address: address, Username: username, Password: string(pw), Dial: rt.Outbound.DialContext}, ops)
		if err != nil {
			// The tenant reads the driver's summary (workflows.get); the operator the whole.
			rt.Logger.WarnContext(ctx, "metal: BMC operations failed", "machine", machine, "error", netpolicy.Detail(err))
		}
		return out, err
	}
	args := BMCArgs{Machine: machine, Driver: driver, Address: address, Username: username, Ops: ops}
	var cmd api.Command
	err = rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT command_id::text FROM compute.metal_step_commands WHERE run_id = $1 AND step = $2 AND attempt = $3`,
			s.RunID, s.Step, s.Attempt).Scan(&id)
		if err == nil {
			cmd, err = rt.Nodes.GetCommand(ctx, tx, id)
			return err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		agents, err := rt.Fleet.SiteAgents(ctx, tx, *site)
		if err != nil {
			return err
		}
		if len(agents) == 0 {
			return provision.Wait(pollEvery, "the machine's site has no site agent (bcd site) to reach its BMC")
		}
		raw, _ := json.Marshal(args)
		secret, _ := json.Marshal(BMCSecret{Password: string(pw)})
		c := &modules.Call{
			Principal: iam.Principal{ID: "workflow:" + s.RunID, Kind: iam.KindService, TenantID: s.TenantID, Name: s.Workflow},
			Target:    modules.Target{TenantID: s.TenantID, ResourceID: machine, Existing: true, Kind: "machine", Ref: machine},
			Tx:        tx, Runtime: rt,
		}
		cmd, err = rt.Nodes.Command(ctx, c, api.CreateCommand{NodeRef: api.NodeRef{Node: agents[0]}, Kind: CommandBMC, Args: raw, Secret: secret, Deadline: "2m"})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO compute.metal_step_commands (run_id, step, attempt, command_id) VALUES ($1, $2, $3, $4)`,
			s.RunID, s.Step, s.Attempt, cmd.ID)
		return err
	})
	if err != nil {
		return power.Outcome{}, err
	}
	switch cmd.State {
	case api.CommandSucceeded:
		var out power.Outcome
		if err := json.Unmarshal(cmd.Result, &out); err != nil {
			return out, fmt.Errorf("the site agent's answer to metal.bmc: %w", err)
		}
		if readOnly(ops) {
			_, err = rt.DB.Pool.Exec(ctx, `DELETE FROM compute.metal_step_commands WHERE run_id = $1 AND step = $2 AND attempt = $3`, s.RunID, s.Step, s.Attempt)
		}
		return out, err
	case api.CommandFailed, api.CommandCancelled:
		// An error: the step's next attempt queues a new command.
		return power.Outcome{}, fmt.Errorf("the site agent's BMC operations %s: %s", cmd.State, cmd.Error)
	}
	return power.Outcome{}, provision.Wait(pollEvery/2, fmt.Sprintf("the site agent is carrying out %d BMC operation(s) (command %s, %s)", len(ops), cmd.ID, cmd.State))
}

func readOnly(ops []power.Op) bool {
	for _, o := range ops {
		if o.Op != power.OpState {
			return false
		}
	}
	return true
}
