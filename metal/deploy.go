package metal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/provision"
)

// A machine's provisioning states.
const (
	StateAvailable = "available"
	StateDeploying = "deploying"
	StateDeployed  = "deployed"
	StateReleasing = "releasing"
	StateFailed    = "failed"
)

// The deploy and release workflows.
const (
	DeployWorkflow  = "metal.deploy"
	ReleaseWorkflow = "metal.release"
)

// Events of deploys and releases; the subject is the machine.
const (
	EventDeployed = "metal.machine_deployed"
	EventReleased = "metal.machine_released"
	EventFailed   = "metal.machine_failed"
)

// DeployPrefix starts the one-use credential a deployed system joins its pool with.
const DeployPrefix = "bcdeploy_"

// The deploy and release methods.
var (
	MachinesDeploy  = api.NewMethod[DeployMachine, DeployRun]("machines", "deploy", true, ResourceMachine, "v0.4", "Deploy an image on a machine: PXE into the ramdisk, wipe, stream and verify the image, boot it, and (with a pool) see it join as a node; a workflow.")
	MachinesRelease = api.NewMethod[MachineRef, DeployRun]("machines", "release", true, ResourceMachine, "v0.4", "Release a machine: wipe its disks through the ramdisk and power it off, back to available; a workflow.")
)

// DeployMachine is the input of machines.deploy.
type DeployMachine struct {
	TenantID string `json:"tenantId,omitempty"`
	Machine  string `json:"machine"`
	Image    string `json:"image"` // id or name
	// Pool, if set, is the pool the deployed system joins as a node (it runs bcd node); the
	// image must carry its kernel (kexec), which is given the join credential.
	Pool string `json:"pool,omitempty"`
	Disk string `json:"disk,omitempty"` // the disk to write, /dev/…; default the largest
	// SSHKeys are public keys the deployed system lets in as root (given on its kernel command
	// line, bcd.ssh_keys=): a dedicated-root lease's hand-over.
	SSHKeys []string `json:"sshKeys,omitempty"`
}

// Validate implements the input check.
func (in DeployMachine) Validate() error {
	if err := api.ValidateRef("machine", in.Machine); err != nil {
		return err
	}
	if err := api.ValidateRef("image", in.Image); err != nil {
		return err
	}
	if in.Pool != "" {
		if err := api.ValidateRef("pool", in.Pool); err != nil {
			return err
		}
	}
	if in.Disk != "" && (!strings.HasPrefix(in.Disk, "/dev/") || path.Clean(in.Disk) != in.Disk || len(in.Disk) > 128 || strings.ContainsAny(in.Disk, " \t\n")) {
		return api.InvalidField("disk", "%q is not a block device under /dev", in.Disk)
	}
	return validateSSHKeys(in.SSHKeys)
}

func validateSSHKeys(keys []string) error {
	if len(keys) > 8 {
		return api.InvalidField("sshKeys", "at most 8 keys")
	}
	for _, k := range keys {
		f := strings.Fields(k)
		if len(f) < 2 || !strings.HasPrefix(f[0], "ssh-") && !strings.HasPrefix(f[0], "ecdsa-") || len(k) > 1024 || strings.ContainsAny(k, "\n\r") {
			return api.InvalidField("sshKeys", "%.40q is not an OpenSSH public key line (ssh-ed25519 AAAA… comment)", k)
		}
	}
	return nil
}

// DeployRun answers machines.deploy and machines.release: the workflow run that carries it out
// (workflows.get, workflows watch) and the machine.
type DeployRun struct {
	Run     string  `json:"run"`
	Machine Machine `json:"machine"`
}

// deployInput is a deploy run's input.
type deployInput struct {
	Machine string   `json:"machine"`
	Image   string   `json:"image"`
	Pool    string   `json:"pool,omitempty"` // its id
	Disk    string   `json:"disk,omitempty"`
	SSHKeys []string `json:"sshKeys,omitempty"`
	Lease   string   `json:"lease,omitempty"`
}

func (m *Module) registerDeploys(r *modules.Registry) {
	r.Actions(modules.ActionsFor(MachinesDeploy.Info(), MachinesRelease.Info())...)
	r.EventTypes(
		modules.EventType{Name: EventDeployed, Description: "A machine was deployed (data: image, node)."},
		modules.EventType{Name: EventReleased, Description: "A machine was wiped and powered off: available again."},
		modules.EventType{Name: EventFailed, Description: "A machine's deploy or release failed (data: workflow, run, error)."},
	)
	r.CommandKind(modules.CommandKind{Name: CommandBMC, Summary: "Carry out BMC operations for the control plane (a site agent).", Check: checkBMCArgs})
	r.JoinCredentials(modules.JoinCredential{Prefix: DeployPrefix, Spend: spendDeployToken})
	target := func(ctx context.Context, l modules.Lookup, in DeployMachine) (modules.Target, error) {
		return machineTarget(ctx, l, MachineRef{TenantID: in.TenantID, Machine: in.Machine})
	}
	modules.Handle(r, MachinesDeploy, target, func(ctx context.Context, c *modules.Call, in DeployMachine) (DeployRun, error) {
		return m.deploy(ctx, c, in, "")
	})
	modules.Handle(r, MachinesRelease, machineTarget, func(ctx context.Context, c *modules.Call, _ MachineRef) (DeployRun, error) {
		return release(ctx, c.Tx, c.Runtime, c.Target.ResourceID, c.Principal.ID, "")
	})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: DeployWorkflow, OnEnd: deployEnded, Steps: []provision.Step[*modules.Runtime]{
		{Name: "plan", MaxAttempts: 3, Run: m.planDeploy},
		{Name: "boot-ramdisk", Timeout: 2 * time.Minute, MaxAttempts: 3, Deadline: 10 * time.Minute, Run: m.bootRamdisk},
		{Name: "ramdisk", Deadline: 30 * time.Minute, Run: waitRamdisk},
		{Name: "write", Deadline: 2 * time.Hour, Run: waitWritten},
		{Name: "boot-disk", MaxAttempts: 3, Run: bootDisk},
		{Name: "join", Deadline: 30 * time.Minute, Run: waitJoined},
		{Name: "ready", MaxAttempts: 3, Run: deployReady},
	}})
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: ReleaseWorkflow, OnEnd: releaseEnded, Steps: []provision.Step[*modules.Runtime]{
		{Name: "plan", MaxAttempts: 3, Run: planRelease},
		{Name: "boot-ramdisk", Timeout: 2 * time.Minute, MaxAttempts: 3, Deadline: 10 * time.Minute, Run: m.bootRamdisk},
		{Name: "ramdisk", Deadline: 30 * time.Minute, Run: waitRamdisk},
		{Name: "wipe", Deadline: time.Hour, Run: waitWritten},
		{Name: "power-off", Timeout: 2 * time.Minute, Deadline: 10 * time.Minute, Run: waitOff},
		{Name: "available", MaxAttempts: 3, Run: releaseDone},
	}})
}

// deploy starts a machine's deploy in c's transaction; lease is the dedicated-root lease it
// serves, if any.
func (m *Module) deploy(ctx context.Context, c *modules.Call, in DeployMachine, lease string) (DeployRun, error) {
	rt := c.Runtime
	mach, err := lockMachine(ctx, c.Tx, c.Target.ResourceID)
	if err != nil {
		return DeployRun{}, err
	}
	switch {
	case mach.State != StateAvailable:
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "machine %s is %s; only an available machine is deployed (machines.release first)", mach.Name, mach.State).
			With("reason", mach.State)
	case mach.Site == "":
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "machine %s has no site: a deploy PXE-boots it through its site's agent", mach.Name).
			With("reason", "no_site")
	}
	img, err := imageRef(ctx, c.Tx, mach.TenantID, in.Image)
	if err != nil {
		return DeployRun{}, err
	}
	comp, err := compose(rt.Registry, mach.Profile)
	if err != nil {
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "machine %s: %v", mach.Name, err)
	}
	if !slices.Contains(comp.image.Formats(), img.Format) {
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "profile %s writes %s images; %s is %s", comp.name, strings.Join(comp.image.Formats(), ", "), img.Name, img.Format).
			With("reason", "format")
	}
	input := deployInput{Machine: mach.ID, Image: img.ID, Disk: in.Disk, SSHKeys: in.SSHKeys, Lease: lease}
	if in.Pool != "" || len(in.SSHKeys) > 0 {
		if img.KernelURL == "" {
			return DeployRun{}, api.InvalidField("image", "joining a pool or handing over SSH keys needs an image with its kernel (kernelUrl): they travel on its command line")
		}
	}
	if in.Pool != "" {
		if m.joinURL == "" {
			return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "the metal module has no JoinURL: a deployed system cannot be told where to join")
		}
		if input.Pool, err = rt.Fleet.PoolID(ctx, c.Tx, mach.TenantID, in.Pool); err != nil {
			return DeployRun{}, err
		}
	}
	run, err := rt.Workflows.Start(ctx, c.Tx, provision.StartWorkflow{Workflow: DeployWorkflow, TenantID: mach.TenantID, Subject: mach.ID, Input: input, CreatedBy: c.Principal.ID})
	if err != nil {
		return DeployRun{}, err
	}
	if err := setState(ctx, c.Tx, mach.ID, StateDeploying, &img.ID); err != nil {
		return DeployRun{}, err
	}
	mach, err = getMachine(ctx, c.Tx, mach.ID)
	return DeployRun{Run: run, Machine: mach}, err
}

// release starts a machine's release in tx.
func release(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, machine, by, lease string) (DeployRun, error) {
	mach, err := lockMachine(ctx, tx, machine)
	if err != nil {
		return DeployRun{}, err
	}
	switch {
	case mach.State != StateDeployed && mach.State != StateFailed && mach.State != StateAvailable:
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "machine %s is %s: wait for it, or cancel its run (workflows.cancel)", mach.Name, mach.State).
			With("reason", mach.State)
	case mach.Site == "":
		return DeployRun{}, api.Errorf(api.CodeFailedPrecondition, "machine %s has no site: a release boots it into its site's ramdisk", mach.Name).
			With("reason", "no_site")
	}
	run, err := rt.Workflows.Start(ctx, tx, provision.StartWorkflow{Workflow: ReleaseWorkflow, TenantID: mach.TenantID, Subject: mach.ID,
		Input: deployInput{Machine: mach.ID, Lease: lease}, CreatedBy: by})
	if err != nil {
		return DeployRun{}, err
	}
	if err := setState(ctx, tx, mach.ID, StateReleasing, nil); err != nil {
		return DeployRun{}, err
	}
	mach, err = getMachine(ctx, tx, mach.ID)
	return DeployRun{Run: run, Machine: mach}, err
}

func lockMachine(ctx context.Context, tx pgx.Tx, id string) (Machine, error) {
	if _, err := tx.Exec(ctx, `SELECT 1 FROM compute.metal_machines WHERE id = $1 FOR UPDATE`, id); err != nil {
		return Machine{}, err
	}
	return getMachine(ctx, tx, id)
}

// setState moves a machine's provisioning state (and its image, when image is not nil).
func setState(ctx context.Context, q postgres.Querier, machine, state string, image *string) error {
	_, err := q.Exec(ctx, `UPDATE compute.metal_machines SET state = $2, image_id = CASE WHEN $3::boolean THEN $4::uuid ELSE image_id END,
		state_changed_at = compute.compute_now() WHERE id = $1`, machine, state, image != nil, image)
	return err
}

// stepInput decodes a run's input.
func stepInput(s *provision.StepRun[*modules.Runtime]) (deployInput, error) {
	var in deployInput
	if err := json.Unmarshal(s.Input, &in); err != nil {
		return in, provision.Permanent(fmt.Errorf("the run's input: %w", err))
	}
	return in, nil
}

// planned is the plan step's output: the machine's task, and when it was given.
type planned struct {
	Task string    `json:"task"`
	At   time.Time `json:"at"`
}

// setTask gives a machine its task (and boot: the ramdisk) in its site's plan, in one
// transaction that moves the site agents' desired state. A task already given (the step run
// again) is kept as it is. (The column token, a token per task that sites handed to ramdisks
// before they minted their own per boot, is no longer written or read.)
func setTask(ctx context.Context, rt *modules.Runtime, machine string, task siteapi.Task, extra func(tx pgx.Tx) error) (planned, error) {
	out := planned{Task: task.ID}
	err := rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var current, site *string
		if err := tx.QueryRow(ctx, `SELECT task->>'id', site_id::text FROM compute.metal_machines WHERE id = $1 FOR UPDATE`, machine).Scan(&current, &site); err != nil {
			return err
		}
		now, err := rt.Clock.Now(ctx, tx)
		if err != nil {
			return err
		}
		out.At = now
		if current != nil && *current == task.ID {
			return nil
		}
		if site == nil {
			return provision.Permanent(errors.New("the machine has no site any more"))
		}
		if extra != nil {
			if err := extra(tx); err != nil {
				return err
			}
		}
		if err := task.Validate(); err != nil {
			return provision.Permanent(fmt.Errorf("the task: %w", err))
		}
		raw, _ := json.Marshal(task)
		if _, err := tx.Exec(ctx, `UPDATE compute.metal_machines SET boot = 'ramdisk', task = $2 WHERE id = $1`, machine, raw); err != nil {
			return err
		}
		return bumpSite(ctx, tx, rt, *site)
	})
	return out, err
}

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// planDeploy gives the machine its deploy task: the image driver's task, then a kexec of the
// image's kernel (with what the system needs to join and be handed over) or a reboot.
func (m *Module) planDeploy(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	rt := s.Runtime
	mach, err := getMachine(ctx, rt.DB.Pool, in.Machine)
	if err != nil {
		return nil, err
	}
	img, err := imageRef(ctx, rt.DB.Pool, mach.TenantID, in.Image)
	if err != nil {
		return nil, provision.Permanent(err)
	}
	comp, err := compose(rt.Registry, mach.Profile)
	if err != nil {
		return nil, provision.Permanent(err)
	}
	then := siteapi.Task{Then: siteapi.ThenReboot, Disk: in.Disk}
	token := DeployPrefix + randomToken(32)
	if img.KernelURL != "" {
		// bcd's arguments go first, the image's after them: the image's command line is parsed
		// and rebuilt rather than appended to, so that nothing in it (an unbalanced quote, a
		// lone "--" handing the rest to init, bcd's names of its own) hides them from the kernel.
		params := []siteapi.CmdlineParam{{Name: siteapi.CmdlineHostname, Value: mach.Name}}
		if in.Pool != "" {
			pin, err := rt.Fleet.CAHash()
			if err != nil {
				return nil, err
			}
			params = append(params, siteapi.CmdlineParam{Name: siteapi.CmdlineJoinURL, Value: m.joinURL},
				siteapi.CmdlineParam{Name: siteapi.CmdlineCAHash, Value: pin})
			// The credential is not on the command line the ramdisk reads with its task: the
			// site hands it to one boot of the machine, whose ramdisk adds it before the kexec.
			then.JoinCredential = token
		}
		if len(in.SSHKeys) > 0 {
			keys, _ := json.Marshal(in.SSHKeys)
			params = append(params, siteapi.CmdlineParam{Name: siteapi.CmdlineSSHKeys, Value: base64.RawURLEncoding.EncodeToString(keys)})
		}
		cmdline, err := siteapi.SetCmdline(img.Cmdline, params...)
		if err != nil {
			return nil, provision.Permanent(fmt.Errorf("the deployed system's kernel command line: %w", err))
		}
		// As the kernel will get it, with the credential the ramdisk adds.
		final := cmdline
		if then.JoinCredential != "" {
			if final, err = siteapi.SetCmdline(cmdline, siteapi.CmdlineParam{Name: siteapi.CmdlineJoin, Value: then.JoinCredential}); err != nil {
				return nil, provision.Permanent(fmt.Errorf("the deployed system's kernel command line: %w", err))
			}
		}
		if len(final) > siteapi.MaxCmdline {
			return nil, provision.Permanent(fmt.Errorf("the kernel command line would be %d bytes, over Linux's %d: fewer or shorter SSH keys", len(final), siteapi.MaxCmdline))
		}
		then.Then, then.Kernel, then.Initrd, then.Cmdline = siteapi.ThenKexec, img.KernelURL, img.InitrdURL, cmdline
	}
	task := comp.image.Task("deploy-"+s.RunID, img, then)
	return setTask(ctx, rt, mach.ID, task, func(tx pgx.Tx) error {
		if in.Pool == "" {
			return nil
		}
		// The deployed system joins its pool once with this credential, taking over the node
		// this machine was before, if it was one of the pool.
		var takeover *string
		if id, err := rt.Fleet.NodeID(ctx, tx, in.Pool, mach.Name); err == nil {
			takeover = &id
		} else if api.CodeOf(err) != api.CodeNotFound {
			return err
		}
		h := sha256.Sum256([]byte(token))
		_, err := tx.Exec(ctx, `INSERT INTO compute.metal_deploy_tokens (token_hash, machine_id, tenant_id, pool_id, run_id, takeover_node, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, compute.compute_now() + interval '3 hours')`, h[:], mach.ID, mach.TenantID, in.Pool, s.RunID, takeover)
		return err
	})
}

// spendDeployToken admits a deployed system into its pool, once.
func spendDeployToken(ctx context.Context, tx pgx.Tx, token string) (modules.Admission, error) {
	h := sha256.Sum256([]byte(token))
	var a modules.Admission
	var takeover *string
	err := tx.QueryRow(ctx, `UPDATE compute.metal_deploy_tokens SET used_at = compute.compute_now()
		WHERE token_hash = $1 AND used_at IS NULL AND expires_at > compute.compute_now() RETURNING tenant_id, pool_id::text, takeover_node::text`, h[:]).
		Scan(&a.TenantID, &a.PoolID, &takeover)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, &modules.JoinRefused{Reason: "unknown, used or expired deploy credential"}
	}
	if takeover != nil {
		a.NodeID = *takeover
	}
	return a, err
}

// bootRamdisk has the machine boot its site's ramdisk, by its profile's boot driver.
func (m *Module) bootRamdisk(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	mach, err := getMachine(ctx, s.Runtime.DB.Pool, in.Machine)
	if err != nil {
		return nil, err
	}
	comp, err := compose(s.Runtime.Registry, mach.Profile)
	if err != nil {
		return nil, provision.Permanent(err)
	}
	ops, err := comp.boot.RamdiskOps(m.ramdiskISO)
	if err != nil {
		return nil, provision.Permanent(err)
	}
	return bmcOps(ctx, s, mach.ID, ops)
}

// waitRamdisk waits for the machine's ramdisk to start its task.
func waitRamdisk(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	var p planned
	if err := s.Output("plan", &p); err != nil {
		return nil, provision.Permanent(err)
	}
	_, started, err := progressOf(ctx, s.Runtime.DB.Pool, p.Task)
	if err != nil {
		return nil, err
	}
	if !started {
		return nil, provision.Wait(pollEvery, "waiting for the machine to boot its ramdisk and start task "+p.Task)
	}
	return nil, nil
}

// waitWritten waits for the ramdisk's task to be done (or to be booting what it wrote).
func waitWritten(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	var p planned
	if err := s.Output("plan", &p); err != nil {
		return nil, provision.Permanent(err)
	}
	pr, _, err := progressOf(ctx, s.Runtime.DB.Pool, p.Task)
	if err != nil {
		return nil, err
	}
	switch pr.Phase {
	case siteapi.PhaseDone, siteapi.PhaseBoot:
		return pr, nil
	case siteapi.PhaseFailed:
		return nil, provision.Permanent(fmt.Errorf("the ramdisk's task %s failed: %s", p.Task, pr.Error))
	case siteapi.PhaseDownload:
		return nil, provision.Wait(pollEvery, fmt.Sprintf("writing the image: %.1f of %.1f MiB", float64(pr.Bytes)/(1<<20), float64(pr.Total)/(1<<20)))
	}
	return nil, provision.Wait(pollEvery, fmt.Sprintf("the ramdisk's task is at %q", cmpOr(pr.Phase, "not started")))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// clearTask takes a machine's task out of its site's plan: it boots its disk from now on.
func clearTask(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, machine string) error {
	var site *string
	if err := tx.QueryRow(ctx, `UPDATE compute.metal_machines SET boot = 'disk', task = NULL WHERE id = $1 RETURNING site_id::text`, machine).
		Scan(&site); err != nil {
		return err
	}
	if site == nil {
		return nil
	}
	return bumpSite(ctx, tx, rt, *site)
}

// bootDisk hands the machine to its disk: the ramdisk boots what it wrote, and the site's plan
// says disk from now on.
func bootDisk(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	return nil, s.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error { return clearTask(ctx, tx, s.Runtime, in.Machine) })
}

// joined is the join step's output.
type joined struct {
	Node string `json:"node,omitempty"`
}

// waitJoined waits, for a deploy into a pool, for the deployed system to join as a node.
func waitJoined(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil || in.Pool == "" {
		return joined{}, err
	}
	rt := s.Runtime
	var used bool
	var name string
	err = rt.DB.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM compute.metal_deploy_tokens WHERE run_id = $2 AND used_at IS NOT NULL), name
		FROM compute.metal_machines WHERE id = $1`, in.Machine, s.RunID).Scan(&used, &name)
	if err != nil {
		return nil, err
	}
	if !used {
		return nil, provision.Wait(pollEvery, "waiting for the deployed system to join its pool (bcd node)")
	}
	node, err := rt.Fleet.NodeID(ctx, rt.DB.Pool, in.Pool, name)
	if err != nil {
		return nil, err
	}
	return joined{Node: node}, nil
}

// deployReady records the machine deployed.
func deployReady(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	var j joined
	if err := s.Output("join", &j); err != nil {
		return nil, provision.Permanent(err)
	}
	return nil, s.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error {
		var node *string
		if j.Node != "" {
			node = &j.Node
		}
		if _, err := tx.Exec(ctx, `UPDATE compute.metal_machines SET state = 'deployed', node_id = coalesce($2, node_id), state_changed_at = compute.compute_now()
			WHERE id = $1`, in.Machine, node); err != nil {
			return err
		}
		if in.Lease != "" {
			if _, err := tx.Exec(ctx, `UPDATE compute.metal_leases SET state = 'ready' WHERE id = $1 AND state = 'deploying'`, in.Lease); err != nil {
				return err
			}
		}
		return s.Runtime.Events.Emit(ctx, tx, modules.Event{Type: EventDeployed, TenantID: s.TenantID, Subject: in.Machine,
			Data: map[string]any{"image": in.Image, "node": j.Node, "run": s.RunID}})
	})
}

// deployEnded marks a machine whose deploy failed or was cancelled: failed, its task taken out
// of its site's plan, its lease failed.
func deployEnded(ctx context.Context, tx pgx.Tx, e *provision.RunEnd[*modules.Runtime]) error {
	if e.State == api.WorkflowSucceeded {
		return nil
	}
	return runFailed(ctx, tx, e, StateDeploying)
}

// releaseEnded ends a released machine's lease, or marks a failed release.
func releaseEnded(ctx context.Context, tx pgx.Tx, e *provision.RunEnd[*modules.Runtime]) error {
	if e.State == api.WorkflowSucceeded {
		return nil
	}
	return runFailed(ctx, tx, e, StateReleasing)
}

func runFailed(ctx context.Context, tx pgx.Tx, e *provision.RunEnd[*modules.Runtime], from string) error {
	var in deployInput
	if err := json.Unmarshal(e.Input, &in); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE compute.metal_machines SET state = 'failed', state_changed_at = compute.compute_now() WHERE id = $1 AND state = $2`, in.Machine, from)
	if err != nil || tag.RowsAffected() == 0 {
		return err
	}
	if err := clearTask(ctx, tx, e.Runtime, in.Machine); err != nil {
		return err
	}
	if in.Lease != "" {
		if _, err := tx.Exec(ctx, `UPDATE compute.metal_leases SET state = 'failed', error = $2, ended_at = compute.compute_now(),
			during = tstzrange(lower(during), greatest(lower(during) + interval '1 microsecond', compute.compute_now()))
			WHERE id = $1 AND state IN ('deploying', 'ready', 'releasing')`, in.Lease, truncate(e.Error, 2048)); err != nil {
			return err
		}
	}
	return e.Runtime.Events.Emit(ctx, tx, modules.Event{Type: EventFailed, TenantID: e.TenantID, Subject: in.Machine,
		Data: map[string]any{"workflow": e.Workflow, "run": e.RunID, "state": e.State, "error": e.Error}})
}

// planRelease gives the machine its wipe task, then a power-off.
func planRelease(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	return setTask(ctx, s.Runtime, in.Machine, siteapi.Task{ID: "release-" + s.RunID, Kind: siteapi.TaskWipe, Then: siteapi.ThenPowerOff}, nil)
}

// waitOff waits for the wiped machine to be off (its ramdisk powers it off), reading its BMC.
func waitOff(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	out, err := bmcOps(ctx, s, in.Machine, []power.Op{{Op: power.OpState}})
	if err != nil {
		return nil, err
	}
	if out.Power != power.Off {
		return nil, provision.Wait(pollEvery, fmt.Sprintf("the machine is %s; its ramdisk powers it off after the wipe", out.Power))
	}
	return out, nil
}

// releaseDone makes the machine available again, and ends its lease.
func releaseDone(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
	in, err := stepInput(s)
	if err != nil {
		return nil, err
	}
	return nil, s.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error {
		if err := clearTask(ctx, tx, s.Runtime, in.Machine); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE compute.metal_machines SET state = 'available', image_id = NULL, power = 'off',
			power_checked_at = compute.compute_now(), state_changed_at = compute.compute_now() WHERE id = $1`, in.Machine); err != nil {
			return err
		}
		if in.Lease != "" {
			if _, err := tx.Exec(ctx, `UPDATE compute.metal_leases SET state = 'ended', ended_at = compute.compute_now() WHERE id = $1`, in.Lease); err != nil {
				return err
			}
		}
		return s.Runtime.Events.Emit(ctx, tx, modules.Event{Type: EventReleased, TenantID: s.TenantID, Subject: in.Machine, Data: map[string]any{"run": s.RunID}})
	})
}
