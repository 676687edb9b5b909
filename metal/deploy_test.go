package metal_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/metal/ipmi"
	"github.com/better-compute/compute/metal/ipmi/ipmisim"
	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/siteagent"
	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/sim"
)

// planRecorder stands for bcd site's services: it keeps the last plan the site agent was given.
type planRecorder struct {
	mu      sync.Mutex
	plan    siteapi.Plan
	n       int
	changed chan struct{} // closed when a plan is set, then replaced
}

func newPlanRecorder() *planRecorder { return &planRecorder{changed: make(chan struct{})} }

func (p *planRecorder) SetPlan(plan siteapi.Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plan, p.n = plan, p.n+1
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

// await waits until the machine's entry in the plan satisfies ok, as the site agent sets new
// plans, and fails the test naming what it waited for after 45 s.
func (p *planRecorder) await(t *testing.T, id, what string, ok func(siteapi.PlanMachine, siteapi.Plan) bool) {
	t.Helper()
	deadline := time.NewTimer(45 * time.Second)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		if pm, plan, _ := p.machine(id); ok(pm, plan) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("not within 45s: %s", what)
		}
	}
}

// machine returns the plan's entry of a machine.
func (p *planRecorder) machine(id string) (siteapi.PlanMachine, siteapi.Plan, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.plan.Machines {
		if m.ID == id {
			return m, p.plan, true
		}
	}
	return siteapi.PlanMachine{}, p.plan, false
}

// siteFleet is a control plane with the metal module, a gateway, a site with a site agent (a
// simulated node of role site carrying metal/siteagent's extension, with the real IPMI
// driver) and a machine of the site whose BMC is ipmi_sim.
type siteFleet struct {
	*computetest.Env
	t        *testing.T
	ctx      context.Context
	url, gw  string
	plan     *planRecorder
	agent    *sim.Node
	chassis  string // ipmi_sim's machine state directory
	machine  metal.Machine
	reporter ext.Reporter
}

const machineMAC = "52:54:00:00:00:01"

func newSiteFleet(t *testing.T) *siteFleet {
	t.Helper()
	ctx := context.Background()
	b, dir := ipmisim.Start(t)
	m, err := metal.New(metal.Options{JoinURL: "http://compute.test"})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m},
		Configure: func(o *compute.Options) { o.HeartbeatInterval = 200 * time.Millisecond }})
	f := &siteFleet{Env: env, t: t, ctx: ctx, plan: newPlanRecorder(), chassis: dir}
	f.url = env.Server(t)
	var stop func()
	f.gw, stop = env.Gateway(t, "") // and the control plane's background work: the workflows
	t.Cleanup(stop)
	a := env.Compute.API
	must(t, func() error { _, err := a.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "fra1"}); return err })
	must(t, func() error {
		_, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "fra1-infra", Site: "fra1"})
		return err
	})
	must(t, func() error {
		_, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "gpu", Site: "fra1"})
		return err
	})
	jt, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "fra1-infra", Role: api.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := sim.Start(ctx, sim.Options{URL: f.url, Token: jt.Token, Gateway: f.gw, Nodes: 1, GPUs: 0, Prefix: "site",
		Extensions: []ext.Extension{siteagent.Extension(f.plan, siteagent.Options{Power: map[string]power.Driver{"ipmi": ipmi.Driver{}}})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Stop)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := fl.WaitConnected(wctx); err != nil {
		t.Fatal(err)
	}
	f.agent, f.reporter = fl.Nodes[0], fl.Nodes[0].Reports
	f.machine, err = compute.Invoke(ctx, env.Compute, env.RootKey, metal.MachinesCreate, metal.CreateMachine{Name: "rack1-00000", Site: "fra1",
		MACs: []string{machineMAC}, BMC: metal.BMCInput{Driver: "ipmi", Address: b.Address, Username: ipmisim.Username, Password: ipmisim.Password}})
	if err != nil {
		t.Fatal(err)
	}
	f.plan.await(t, f.machine.ID, "the site's plan to list the machine", func(pm siteapi.PlanMachine, _ siteapi.Plan) bool {
		return pm.Boot == siteapi.BootDisk && slices.Equal(pm.MACs, []string{machineMAC})
	})
	return f
}

// noTaskBootDisk: the machine boots its disk, with no task.
func noTaskBootDisk(pm siteapi.PlanMachine, _ siteapi.Plan) bool {
	return pm.Task == nil && pm.Boot == siteapi.BootDisk
}

func must(t *testing.T, fn func() error) {
	t.Helper()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
}

// eventually waits for what the control plane's workflows do, which the test is not told of.
func (f *siteFleet) eventually(what string, cond func() bool) {
	f.t.Helper()
	computetest.Eventually(f.t, 45*time.Second, what, cond)
}

func (f *siteFleet) get() metal.Machine {
	f.t.Helper()
	m, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.MachinesGet, metal.MachineRef{Machine: f.machine.ID})
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

// run waits for a workflow run to end, and returns it.
func (f *siteFleet) run(id string) api.WorkflowRun {
	f.t.Helper()
	var run api.WorkflowRun
	f.eventually("run "+id+" to end", func() bool {
		var err error
		run, err = f.Compute.API.Workflows.Get(f.ctx, f.RootKey, api.GetWorkflow{Run: id})
		if err != nil {
			f.t.Fatal(err)
		}
		return run.State != api.WorkflowRunning
	})
	return run
}

// step waits for a run's step to be reached (current, or done).
func (f *siteFleet) step(id, step string) {
	f.t.Helper()
	var run api.WorkflowRun
	defer func() {
		if f.t.Failed() {
			b, _ := json.MarshalIndent(run, "", " ")
			f.t.Logf("the run: %s", b)
		}
	}()
	f.eventually("run "+id+" to reach "+step, func() bool {
		var err error
		run, err = f.Compute.API.Workflows.Get(f.ctx, f.RootKey, api.GetWorkflow{Run: id})
		if err != nil {
			f.t.Fatal(err)
		}
		if run.State == api.WorkflowFailed {
			f.t.Fatalf("run %s failed: %s", id, run.Error)
		}
		return run.Step == step || run.State == api.WorkflowSucceeded
	})
}

// task waits for the plan to give the machine a task of kind, and returns it.
func (f *siteFleet) task(kind string) siteapi.Task {
	f.t.Helper()
	var task siteapi.Task
	f.plan.await(f.t, f.machine.ID, "a "+kind+" task in the site's plan", func(pm siteapi.PlanMachine, _ siteapi.Plan) bool {
		if pm.Task == nil || pm.Task.Kind != kind || pm.Boot != siteapi.BootRamdisk {
			return false
		}
		task = *pm.Task
		return true
	})
	return task
}

// ramdisk reports, as the site agent does for a machine's ramdisk, the given phases of task.
func (f *siteFleet) ramdisk(task siteapi.Task, phases ...siteapi.Progress) {
	f.t.Helper()
	for _, p := range phases {
		p.Machine, p.Task = f.machine.ID, task.ID
		if err := f.reporter.Report(f.ctx, siteapi.KindTaskProgress, p); err != nil {
			f.t.Fatalf("progress %s: %v", p.Phase, err)
		}
	}
}

func (f *siteFleet) events(typ string) int {
	f.t.Helper()
	return computetest.Count(f.t, f.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = $1 AND subject = $2`, typ, f.machine.ID)
}

// powerOff is the machine powering itself off, as its ramdisk does after a wipe.
func (f *siteFleet) powerOff() {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.chassis, "power.state"), []byte("0\n"), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func cmdlineValue(cmdline, key string) string {
	for _, w := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return v
		}
	}
	return ""
}

const tinySHA = "5647f05ec18958947d32874eeb788fa396a05d0bab7c1b71f112ceb7e9b31eee"

func (f *siteFleet) registerImage(name, format, kernel string) metal.Image {
	f.t.Helper()
	img, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.ImagesRegister, metal.RegisterImage{Name: name, URL: "http://images.test/" + name,
		Format: format, SizeBytes: 1 << 20, SHA256: tinySHA, KernelURL: kernel, Cmdline: "root=/dev/vda console=ttyS0"})
	if err != nil {
		f.t.Fatal(err)
	}
	return img
}

// TestADeployAndAReleaseGoThroughTheSiteAgent drives a machine of a site through a deploy into a
// pool and a release, as its site agent and ramdisk would: the plan the site agent converges,
// the BMC operations it carries out against ipmi_sim with the password it is sent as a
// command's secret, the ramdisk's reports, the deployed system's one join, and the states,
// events and plan at each step.
func TestADeployAndAReleaseGoThroughTheSiteAgent(t *testing.T) {
	t.Parallel()
	f := newSiteFleet(t)
	ctx, c, key := f.ctx, f.Compute, f.RootKey
	img := f.registerImage("tiny", "raw", "http://images.test/vmlinuz")
	f.registerImage("tiny-qcow", "qcow2", "")
	noKernel := f.registerImage("tiny-nokernel", "raw", "")

	// Refusals change nothing: a format the profile cannot write, a pool without a kernel to
	// join with, a machine without a site.
	for _, bad := range []struct {
		in   metal.DeployMachine
		code api.Code
	}{
		{metal.DeployMachine{Machine: f.machine.ID, Image: "tiny-qcow"}, api.CodeFailedPrecondition},
		{metal.DeployMachine{Machine: f.machine.ID, Image: noKernel.ID, Pool: "gpu"}, api.CodeInvalidArgument},
		{metal.DeployMachine{Machine: f.machine.ID, Image: img.ID, Disk: "/dev/../etc/passwd"}, api.CodeInvalidArgument},
		{metal.DeployMachine{Machine: f.machine.ID, Image: "nope"}, api.CodeNotFound},
	} {
		if _, err := compute.Invoke(ctx, c, key, metal.MachinesDeploy, bad.in); api.CodeOf(err) != bad.code {
			t.Errorf("deploy %+v = %v, want %s", bad.in, err, bad.code)
		}
	}
	if m := f.get(); m.State != metal.StateAvailable || m.Task != nil {
		t.Fatalf("after refused deploys the machine is %+v", m)
	}

	dr, err := compute.Invoke(ctx, c, key, metal.MachinesDeploy, metal.DeployMachine{Machine: f.machine.ID, Image: "tiny", Pool: "gpu", Disk: "/dev/vda"})
	if err != nil {
		t.Fatal(err)
	}
	if dr.Machine.State != metal.StateDeploying || dr.Machine.Image != img.ID {
		t.Fatalf("deploy answered %+v", dr.Machine)
	}
	if _, err := compute.Invoke(ctx, c, key, metal.MachinesDeploy, metal.DeployMachine{Machine: f.machine.ID, Image: "tiny"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Errorf("a second deploy while deploying = %v, want failed_precondition", err)
	}
	task := f.task(siteapi.TaskDeploy)
	if task.Image == nil || task.Image.SHA256 != tinySHA || task.Then != siteapi.ThenKexec || task.Kernel != img.KernelURL || task.Disk != "/dev/vda" {
		t.Fatalf("the deploy task is %+v", task)
	}
	// The join credential is the task's, for the site to hand to one boot: not on the command
	// line a ramdisk reads with its task.
	token := task.JoinCredential
	if !strings.HasPrefix(token, metal.DeployPrefix) || strings.Contains(task.Cmdline, token) || cmdlineValue(task.Cmdline, "bcd.join") != "" ||
		cmdlineValue(task.Cmdline, "bcd.hostname") != "rack1-00000" ||
		cmdlineValue(task.Cmdline, "root") != "/dev/vda" || cmdlineValue(task.Cmdline, "bcd.url") != "http://compute.test" ||
		!strings.HasPrefix(cmdlineValue(task.Cmdline, "bcd.ca_hash"), "sha256:") {
		t.Fatalf("the deployed system's command line is %q", task.Cmdline)
	}
	if _, plan, _ := f.plan.machine(f.machine.ID); len(plan.Images) != 1 || plan.Images[0].SHA256 != tinySHA {
		t.Fatalf("the plan's images are %+v, want the deploy's image", plan.Images)
	}

	// The site agent boots the machine into its ramdisk through ipmi_sim: PXE, off, on.
	f.step(dr.Run, "ramdisk")
	if got := ipmisim.Log(t, f.chassis); !slices.Equal(got, []string{"boot pxe", "power 0", "power 1"}) {
		t.Fatalf("the chassis was told %q, want PXE then a cold start", got)
	}
	var secrets int
	if err := f.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.commands WHERE kind = 'metal.bmc' AND (secret IS NOT NULL OR args::text LIKE '%'||$1||'%')`,
		ipmisim.Password).Scan(&secrets); err != nil || secrets != 0 {
		t.Fatalf("%d metal.bmc commands still hold the BMC password (%v): it travels sealed and is erased once done", secrets, err)
	}

	// The ramdisk says hello and works through its task; a report of another task is refused.
	if err := f.reporter.Report(ctx, siteapi.KindMachineSeen, siteapi.MachineSeen{Machine: f.machine.ID,
		Facts: siteapi.Facts{Serial: "SN-1", MACs: []string{machineMAC}, CPUs: 2, MemoryGiB: 1}}); err != nil {
		t.Fatal(err)
	}
	if m := f.get(); m.SeenAt == nil || m.Facts.Serial != "SN-1" || f.events(metal.EventMachineSeen) != 1 {
		t.Fatalf("after the ramdisk's hello the machine is %+v", m)
	}
	f.ramdisk(task, siteapi.Progress{Phase: siteapi.PhaseStarted}, siteapi.Progress{Phase: siteapi.PhaseWipe},
		siteapi.Progress{Phase: siteapi.PhaseDownload, Bytes: 512 << 10, Total: 1 << 20})
	if m := f.get(); m.Task == nil || m.Task.ID != task.ID || m.Task.Phase != siteapi.PhaseDownload || m.Task.Bytes != 512<<10 {
		t.Fatalf("machines.get shows the task as %+v", m.Task)
	}
	err = f.reporter.Report(ctx, siteapi.KindTaskProgress, siteapi.Progress{Machine: f.machine.ID, Task: "deploy-other", Phase: siteapi.PhaseDone})
	if refused := (*sim.RefusedError)(nil); !errors.As(err, &refused) || !strings.Contains(err.Error(), "has no task deploy-other") {
		t.Fatalf("progress of another task = %v, want a refusal", err)
	}
	f.ramdisk(task, siteapi.Progress{Phase: siteapi.PhaseDownload, Bytes: 1 << 20, Total: 1 << 20}, siteapi.Progress{Phase: siteapi.PhaseVerify},
		siteapi.Progress{Phase: siteapi.PhaseBoot})

	// The disk is written: the plan says disk, and the deployed system joins its pool once.
	f.step(dr.Run, "join")
	f.plan.await(t, f.machine.ID, "the plan to boot the disk with no task after the write", noTaskBootDisk) // the site agent hears of it by a push
	node, err := sim.Start(ctx, sim.Options{URL: f.url, Token: token, Gateway: f.gw, Nodes: 1, GPUs: 8, Prefix: "rack1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Stop)
	if run := f.run(dr.Run); run.State != api.WorkflowSucceeded {
		t.Fatalf("the deploy ended %s: %s", run.State, run.Error)
	}
	m := f.get()
	if m.State != metal.StateDeployed || m.NodeID != node.Nodes[0].NodeID() || m.Task != nil || f.events(metal.EventDeployed) != 1 {
		t.Fatalf("after the deploy the machine is %+v", m)
	}
	if _, err := sim.Start(ctx, sim.Options{URL: f.url, Token: token, Nodes: 1, Prefix: "again"}); err == nil || !strings.Contains(err.Error(), "unknown, used or expired") {
		t.Fatalf("a second join with the deploy's credential = %v, want a refusal", err)
	}

	// The release wipes it through the ramdisk, which powers it off: available again.
	rr, err := compute.Invoke(ctx, c, key, metal.MachinesRelease, metal.MachineRef{Machine: f.machine.ID})
	if err != nil || rr.Machine.State != metal.StateReleasing {
		t.Fatalf("release = %+v, %v", rr.Machine, err)
	}
	wipe := f.task(siteapi.TaskWipe)
	if wipe.Then != siteapi.ThenPowerOff {
		t.Fatalf("the release's task is %+v", wipe)
	}
	f.step(rr.Run, "ramdisk")
	f.ramdisk(wipe, siteapi.Progress{Phase: siteapi.PhaseStarted}, siteapi.Progress{Phase: siteapi.PhaseWipe}, siteapi.Progress{Phase: siteapi.PhaseBoot})
	f.step(rr.Run, "power-off")
	f.powerOff()
	if run := f.run(rr.Run); run.State != api.WorkflowSucceeded {
		t.Fatalf("the release ended %s: %s", run.State, run.Error)
	}
	if m := f.get(); m.State != metal.StateAvailable || m.Image != "" || m.Power != "off" || f.events(metal.EventReleased) != 1 {
		t.Fatalf("after the release the machine is %+v", m)
	}
	f.plan.await(t, f.machine.ID, "the plan to boot the disk with no task after the release", noTaskBootDisk)
}

// TestAFailedDeployMarksTheMachineFailed: the ramdisk's failure fails the run; the run's end
// marks the machine failed and takes its task out of the plan, in one commit; a release
// brings it back.
func TestAFailedDeployMarksTheMachineFailed(t *testing.T) {
	t.Parallel()
	f := newSiteFleet(t)
	// A private image: its pull token is write-only, and reaches the site agent alone.
	const pullToken = "pull-t0ken-for-the-registry"
	img, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.ImagesRegister, metal.RegisterImage{Name: "tiny", URL: "https://registry.test/tiny",
		Format: "raw", SizeBytes: 1 << 20, SHA256: tinySHA, PullToken: pullToken})
	if err != nil || !img.PullTokenSet {
		t.Fatalf("images.register = %+v, %v", img, err)
	}
	if list, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.ImagesList, metal.ListImages{}); err != nil || strings.Contains(fmtJSON(list), pullToken) {
		t.Fatalf("images.list shows the pull token (%v)", err)
	}
	dr, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.MachinesDeploy, metal.DeployMachine{Machine: f.machine.ID, Image: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	task := f.task(siteapi.TaskDeploy)
	if task.Then != siteapi.ThenReboot {
		t.Fatalf("an image without its kernel is booted by a reboot; the task says %q", task.Then)
	}
	if _, plan, _ := f.plan.machine(f.machine.ID); len(plan.Images) != 1 || plan.Images[0].Authorization != "Bearer "+pullToken || task.Image.Authorization != "" {
		t.Fatalf("the plan's images %+v and the task's %+v: the site agent gets the token, the ramdisk's task does not", plan.Images, task.Image)
	}
	f.step(dr.Run, "ramdisk")
	f.ramdisk(task, siteapi.Progress{Phase: siteapi.PhaseStarted}, siteapi.Progress{Phase: siteapi.PhaseFailed, Error: "sha256 mismatch: got ab…, want 56…"})
	run := f.run(dr.Run)
	if run.State != api.WorkflowFailed || !strings.Contains(run.Error, "sha256 mismatch") {
		t.Fatalf("the deploy ended %s: %q", run.State, run.Error)
	}
	if m := f.get(); m.State != metal.StateFailed || m.Task != nil || f.events(metal.EventFailed) != 1 {
		t.Fatalf("after a failed deploy the machine is %+v", m)
	}
	f.plan.await(t, f.machine.ID, "the plan to drop the failed task", noTaskBootDisk)
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.MachinesRelease, metal.MachineRef{Machine: f.machine.ID}); err != nil {
		t.Fatalf("a failed machine is released: %v", err)
	}
}

// TestALeaseDeploysHandsOverAndReleases: a dedicated-root lease books the machine (a second is
// refused by the exclusion constraint), deploys it with the holder's keys on the kernel command
// line, is ready once deployed, and when ended releases the machine and ends.
func TestALeaseDeploysHandsOverAndReleases(t *testing.T) {
	t.Parallel()
	f := newSiteFleet(t)
	ctx, c, key := f.ctx, f.Compute, f.RootKey
	f.registerImage("tiny", "raw", "http://images.test/vmlinuz")
	const sshKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice"
	if _, err := compute.Invoke(ctx, c, key, metal.LeasesCreate, metal.CreateLease{Site: "fra1", Image: "tiny"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a lease without SSH keys = %v, want invalid_argument", err)
	}
	l, err := compute.Invoke(ctx, c, key, metal.LeasesCreate, metal.CreateLease{Site: "fra1", Image: "tiny", SSHKeys: []string{sshKey}, Duration: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if l.Machine != f.machine.ID || l.State != "deploying" || l.Run == "" || l.End.Sub(l.Start) != time.Hour {
		t.Fatalf("lease = %+v", l)
	}
	if _, err := compute.Invoke(ctx, c, key, metal.LeasesCreate, metal.CreateLease{Machine: f.machine.ID, Image: "tiny", SSHKeys: []string{sshKey}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a second lease of the machine = %v, want conflict", err)
	}
	if _, err := compute.Invoke(ctx, c, key, metal.LeasesCreate, metal.CreateLease{Site: "fra1", Image: "tiny", SSHKeys: []string{sshKey}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a lease at a site with no machine left = %v, want conflict", err)
	}
	task := f.task(siteapi.TaskDeploy)
	var keys []string
	raw, _ := decodeB64(cmdlineValue(task.Cmdline, "bcd.ssh_keys"))
	if err := json.Unmarshal(raw, &keys); err != nil || !slices.Equal(keys, []string{sshKey}) {
		t.Fatalf("the holder's keys on the command line = %q (%v), want them", keys, err)
	}
	f.step(l.Run, "ramdisk")
	f.ramdisk(task, siteapi.Progress{Phase: siteapi.PhaseStarted}, siteapi.Progress{Phase: siteapi.PhaseBoot})
	if run := f.run(l.Run); run.State != api.WorkflowSucceeded {
		t.Fatalf("the lease's deploy ended %s: %s", run.State, run.Error)
	}
	if got, err := compute.Invoke(ctx, c, key, metal.LeasesGet, metal.LeaseRef{Lease: l.ID}); err != nil || got.State != "ready" {
		t.Fatalf("after its deploy the lease is %+v, %v; want ready", got, err)
	}

	ended, err := compute.Invoke(ctx, c, key, metal.LeasesEnd, metal.LeaseRef{Lease: l.ID})
	if err != nil || ended.State != "releasing" || ended.Run == l.Run || !ended.End.Before(l.End) {
		t.Fatalf("leases.end = %+v, %v", ended, err)
	}
	if _, err := compute.Invoke(ctx, c, key, metal.LeasesEnd, metal.LeaseRef{Lease: l.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("ending it twice = %v, want failed_precondition", err)
	}
	wipe := f.task(siteapi.TaskWipe)
	f.step(ended.Run, "ramdisk")
	f.ramdisk(wipe, siteapi.Progress{Phase: siteapi.PhaseStarted}, siteapi.Progress{Phase: siteapi.PhaseBoot})
	f.step(ended.Run, "power-off")
	f.powerOff()
	if run := f.run(ended.Run); run.State != api.WorkflowSucceeded {
		t.Fatalf("the lease's release ended %s: %s", run.State, run.Error)
	}
	if got, err := compute.Invoke(ctx, c, key, metal.LeasesGet, metal.LeaseRef{Lease: l.ID}); err != nil || got.State != "ended" || got.EndedAt == nil {
		t.Fatalf("after its release the lease is %+v, %v; want ended", got, err)
	}
	// The machine is free again: a new lease takes it.
	if _, err := compute.Invoke(ctx, c, key, metal.LeasesCreate, metal.CreateLease{Machine: f.machine.ID, Image: "tiny", SSHKeys: []string{sshKey}}); err != nil {
		t.Fatalf("a new lease of the released machine: %v", err)
	}
}

func decodeB64(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

func fmtJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestTheDeployedKernelSeesBcdsArguments: an image's command line with an unbalanced quote and
// a lone "--" (after which Linux gives the words to init) does not hide bcd's arguments from
// the deployed kernel, split as Linux splits it; its own bcd.hostname does not count twice.
// FuzzSetCmdline (metal/siteapi) checks the same of any command line.
func TestTheDeployedKernelSeesBcdsArguments(t *testing.T) {
	t.Parallel()
	f := newSiteFleet(t)
	const cmdline = `root=/dev/vda bcd.hostname=not-this -- single console="ttyS0`
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.ImagesRegister, metal.RegisterImage{Name: "odd", URL: "http://images.test/odd",
		Format: "raw", SizeBytes: 1 << 20, SHA256: tinySHA, KernelURL: "http://images.test/vmlinuz", Cmdline: cmdline}); err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, metal.MachinesDeploy, metal.DeployMachine{Machine: f.machine.ID, Image: "odd", Pool: "gpu"}); err != nil {
		t.Fatal(err)
	}
	task := f.task(siteapi.TaskDeploy)
	args, init, _ := siteapi.SplitCmdline(task.Cmdline)
	seen := map[string][]string{}
	for _, a := range args {
		seen[a.Name] = append(seen[a.Name], a.Value)
	}
	for name, want := range map[string]string{"root": "/dev/vda", siteapi.CmdlineHostname: "rack1-00000", siteapi.CmdlineJoinURL: "http://compute.test"} {
		if got := seen[name]; len(got) != 1 || got[0] != want {
			t.Errorf("the kernel sees %s as %q, want once, %q (command line %q)", name, got, want, task.Cmdline)
		}
	}
	if got := seen[siteapi.CmdlineCAHash]; len(got) != 1 || !strings.HasPrefix(got[0], "sha256:") {
		t.Errorf("the kernel sees %s as %q (command line %q)", siteapi.CmdlineCAHash, got, task.Cmdline)
	}
	if init != `single console="ttyS0` {
		t.Errorf("init is given %q, want the image's own %q", init, `single console="ttyS0`)
	}
	if !strings.HasPrefix(task.JoinCredential, metal.DeployPrefix) || seen[siteapi.CmdlineJoin] != nil {
		t.Errorf("the join credential is %q, and the command line %q: want it apart (the ramdisk adds it)", task.JoinCredential, task.Cmdline)
	}
}
