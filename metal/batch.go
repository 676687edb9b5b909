package metal

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// The batch forms of the destructive machine methods: all or none, and over the tenant's
// destructive-batch quorum policy only with an approval of that very batch by other principals
// (modules.Runtime.Quorum; docs/fleet.md, "Destructive-batch quorum"). The percent limit is of
// the tenant's machines at each site.
var (
	MachinesReleaseMany = api.NewMethod[ReleaseMachines, MachineBatch]("machines", "releaseMany", true, ResourceMachine, "v1.0",
		"Release several machines at once: each is wiped through the ramdisk and powered off; a batch over the tenant's quorum policy needs others' approval.")
	MachinesDeployMany = api.NewMethod[DeployMachines, MachineBatch]("machines", "deployMany", true, ResourceMachine, "v1.0",
		"Deploy an image on several machines at once (each wiped and written); a batch over the tenant's quorum policy needs others' approval.")
)

// ReleaseMachines is the input of machines.releaseMany.
type ReleaseMachines struct {
	TenantID string   `json:"tenantId,omitempty"`
	Machines []string `json:"machines"` // ids or names
	// Approval is an approved approval of this very batch (api.DrainNodes.Approval).
	Approval string `json:"approval,omitempty"`
}

// Validate implements the input check.
func (in ReleaseMachines) Validate() error {
	if err := api.ValidateBatch("machines", in.Machines); err != nil {
		return err
	}
	return api.ValidateApproval(in.Approval)
}

// DeployMachines is the input of machines.deployMany: machines.deploy's, for several machines.
type DeployMachines struct {
	TenantID string   `json:"tenantId,omitempty"`
	Machines []string `json:"machines"`
	Image    string   `json:"image"`
	Pool     string   `json:"pool,omitempty"`
	Disk     string   `json:"disk,omitempty"`
	SSHKeys  []string `json:"sshKeys,omitempty"`
	Approval string   `json:"approval,omitempty"`
}

// one is the deploy of one machine of the batch.
func (in DeployMachines) one(machine string) DeployMachine {
	return DeployMachine{TenantID: in.TenantID, Machine: machine, Image: in.Image, Pool: in.Pool, Disk: in.Disk, SSHKeys: in.SSHKeys}
}

// Validate implements the input check.
func (in DeployMachines) Validate() error {
	if err := api.ValidateBatch("machines", in.Machines); err != nil {
		return err
	}
	if err := in.one(in.Machines[0]).Validate(); err != nil {
		return err
	}
	return api.ValidateApproval(in.Approval)
}

// MachineBatch answers a batch of machines: each one's run, in the order named.
type MachineBatch struct {
	Runs []DeployRun `json:"runs"`
	// Approval is the approval the batch spent, if it needed one.
	Approval string `json:"approval,omitempty"`
}

func (m *Module) registerBatches(r *modules.Registry) {
	r.Actions(modules.ActionsFor(MachinesReleaseMany.Info(), MachinesDeployMany.Info())...)
	modules.Handle(r, MachinesReleaseMany, nil, func(ctx context.Context, c *modules.Call, in ReleaseMachines) (MachineBatch, error) {
		return machineBatch(ctx, c, MachinesReleaseMany.FullName(), in.Machines, nil, in.Approval, func(id string) (DeployRun, error) {
			return release(ctx, c.Tx, c.Runtime, id, c.Principal.ID, "")
		})
	})
	modules.Handle(r, MachinesDeployMany, nil, func(ctx context.Context, c *modules.Call, in DeployMachines) (MachineBatch, error) {
		params := map[string]any{"image": in.Image, "pool": in.Pool, "disk": in.Disk, "sshKeys": in.SSHKeys}
		return machineBatch(ctx, c, MachinesDeployMany.FullName(), in.Machines, params, in.Approval, func(id string) (DeployRun, error) {
			one := *c
			one.Target.ResourceID = id
			return m.deploy(ctx, &one, in.one(id), "")
		})
	})
}

// machineBatch resolves the machines of a batch in the call's tenant, passes the quorum gate
// and then does one to each machine, in id order, answering them in the order named.
func machineBatch(ctx context.Context, c *modules.Call, method string, refs []string, params map[string]any, approval string,
	one func(id string) (DeployRun, error)) (MachineBatch, error) {
	ids := make([]string, len(refs))
	sites := map[string]string{}
	named := map[string]string{}
	for i, ref := range refs {
		var site *string
		err := c.Tx.QueryRow(ctx, `SELECT id::text, site_id::text FROM compute.metal_machines WHERE tenant_id = $2 AND (id::text = $1 OR name = $1)
			ORDER BY (id::text = $1) DESC LIMIT 1`, ref, c.Target.TenantID).Scan(&ids[i], &site)
		if errors.Is(err, pgx.ErrNoRows) {
			return MachineBatch{}, api.NotFound("machine", ref)
		}
		if err != nil {
			return MachineBatch{}, err
		}
		if other, dup := named[ids[i]]; dup {
			return MachineBatch{}, api.InvalidField("machines", "%q and %q are the same machine", other, ref)
		}
		named[ids[i]] = ref
		if site != nil {
			sites[ids[i]] = *site
		}
	}
	groups, err := siteGroups(ctx, c.Tx, c.Target.TenantID, sites)
	if err != nil {
		return MachineBatch{}, err
	}
	spent, err := c.Runtime.Quorum.Check(ctx, c, modules.Batch{Method: method, Targets: ids, Groups: groups, Params: params, Approval: approval})
	if err != nil {
		return MachineBatch{}, err
	}
	done := map[string]DeployRun{}
	for _, id := range slices.Sorted(slices.Values(ids)) {
		if done[id], err = one(id); err != nil {
			return MachineBatch{}, err
		}
	}
	out := MachineBatch{Runs: make([]DeployRun, len(ids)), Approval: spent}
	for i, id := range ids {
		out.Runs[i] = done[id]
	}
	return out, nil
}

// siteGroups counts, for each site a batch's machines are at, the tenant's machines there and
// the batch's.
func siteGroups(ctx context.Context, q postgres.Querier, tenant string, sites map[string]string) ([]modules.BatchGroup, error) {
	count := map[string]int{}
	for _, s := range sites {
		count[s]++
	}
	var groups []modules.BatchGroup
	for _, s := range slices.Sorted(maps.Keys(count)) {
		g := modules.BatchGroup{Kind: "site", ID: s, Count: count[s]}
		if err := q.QueryRow(ctx, `SELECT count(*) FROM compute.metal_machines WHERE tenant_id = $1 AND site_id = $2`, tenant, s).Scan(&g.Size); err != nil {
			return nil, err
		}
		groups = append(groups, g)
	}
	return groups, nil
}
