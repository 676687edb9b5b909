package vps_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/sim"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/hostapi"
)

// fleet is the control plane of the module's tests: a pool "mixed" of two simulated nodes with
// two GPUs each, of which the first is a VM host (it reported vps.host, and carries vm=yes), and a
// flavor and an image.
type fleet struct {
	*computetest.Env
	ctx    context.Context
	nodes  *sim.Fleet
	host   *sim.Node // the VM host
	hostID string
	// rt is the runtime compute.Initialize handed the modules: what the vps module reads of the
	// core (its services), read as the module reads it.
	rt *modules.Runtime
}

// runtimeOf is a module that contributes nothing and keeps the runtime it is initialized with.
type runtimeOf struct{ rt *modules.Runtime }

func (*runtimeOf) Name() string { return "vps-test-runtime" }

func (m *runtimeOf) Register(r *modules.Registry) error {
	r.OnInitialize(func(_ context.Context, rt *modules.Runtime) error { m.rt = rt; return nil })
	return nil
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetWith(t, vps.Options{})
}

// newFleetWith is newFleet with the module's options, its workers every 200 ms unless set.
func newFleetWith(t *testing.T, opts vps.Options) *fleet {
	t.Helper()
	opts.ReconcileEvery = cmp.Or(opts.ReconcileEvery, 200*time.Millisecond)
	opts.SandboxEvery = cmp.Or(opts.SandboxEvery, 200*time.Millisecond)
	m, err := vps.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's default heartbeat interval: a node goes offline only when a test disconnects
	// it (sim.Node.Disconnect takes it offline at the next flush), never because a loaded
	// machine delayed its heartbeats past a short grace (a warm VM's host offline is no place
	// for a sandbox).
	spy := &runtimeOf{}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m, spy}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	a, key := env.Compute.API, env.RootKey
	if _, err := a.Pools.Create(ctx, key, api.CreatePool{Name: "mixed"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(ctx, key, api.CreateJoinToken{Pool: "mixed", MaxUses: 2})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := sim.Start(ctx, sim.Options{URL: url, Token: jt.Token, Gateway: gw, Nodes: 2, GPUs: 2, Prefix: "n", Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodes.Stop)
	if err := nodes.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fleet{Env: env, ctx: ctx, nodes: nodes, rt: spy.rt}
	f.host = nodes.Nodes[0]
	f.hostID = f.host.NodeID()
	if err := f.host.Reports.Report(ctx, hostapi.KindHost, hostapi.Host{Runtime: "libvirt-kvm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Nodes.SetLabels(ctx, key, api.SetNodeLabels{NodeRef: api.NodeRef{Pool: "mixed", Node: f.host.Name}, Labels: map[string]string{"vm": "yes"}}); err != nil {
		t.Fatal(err)
	}
	f.invoke(t, vps.FlavorsCreate, vps.CreateFlavor{Name: "gpu1", VCPUs: 2, MemoryGiB: 4, GPUs: 1, RequireLabels: map[string]string{"vm": "yes"}})
	f.invoke(t, vps.FlavorsCreate, vps.CreateFlavor{Name: "cpu16", VCPUs: 16, MemoryGiB: 8, RequireLabels: map[string]string{"vm": "yes"}})
	f.invoke(t, vps.FlavorsCreate, vps.CreateFlavor{Name: "anywhere", VCPUs: 1, MemoryGiB: 1})
	f.invoke(t, vps.VMImagesRegister, vps.RegisterVMImage{Name: "guest", Cmdline: "console=ttyS0",
		Kernel: &vps.Artifact{URL: "https://images.test/vmlinuz", SHA256: strings.Repeat("a", 64)}})
	return f
}

// invoke calls a method as the root tenant's admin, failing the test on an error.
func (f *fleet) invoke(t *testing.T, m any, in any) any {
	t.Helper()
	out, err := f.call(m, in)
	if err != nil {
		t.Fatalf("%v: %v", in, err)
	}
	return out
}

// call calls one of the module's methods (those the tests use) as the root tenant's admin.
func (f *fleet) call(m any, in any) (any, error) {
	c, key := f.Compute, f.RootKey
	switch m := m.(type) {
	case api.Method[vps.CreateFlavor, vps.Flavor]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.CreateFlavor))
	case api.Method[vps.FlavorRef, vps.Flavor]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.FlavorRef))
	case api.Method[vps.RegisterVMImage, vps.VMImage]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.RegisterVMImage))
	case api.Method[vps.CreateInstance, vps.Instance]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.CreateInstance))
	case api.Method[vps.InstanceRef, vps.Instance]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.InstanceRef))
	case api.Method[vps.InstanceRef, api.TunnelTicket]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.InstanceRef))
	case api.Method[vps.ListInstances, api.Page[vps.Instance]]:
		return compute.Invoke(f.ctx, c, key, m, in.(vps.ListInstances))
	}
	return nil, fmt.Errorf("the test calls no %T", m)
}

func (f *fleet) create(name, flavor string) (vps.Instance, error) {
	out, err := f.call(vps.InstancesCreate, vps.CreateInstance{Name: name, Pool: "mixed", Flavor: flavor, Image: "guest"})
	i, _ := out.(vps.Instance)
	return i, err
}

func (f *fleet) do(t *testing.T, m api.Method[vps.InstanceRef, vps.Instance], id string) vps.Instance {
	t.Helper()
	return f.invoke(t, m, vps.InstanceRef{Instance: id}).(vps.Instance)
}

// desired is the host's vps.instances part, once it satisfies ok.
func (f *fleet) desired(t *testing.T, ok func(hostapi.Instances) bool) hostapi.Instances {
	t.Helper()
	return f.desiredOf(t, f.host, ok)
}

// desiredOf is a node's vps.instances part, once it satisfies ok.
func (f *fleet) desiredOf(t *testing.T, n *sim.Node, ok func(hostapi.Instances) bool) hostapi.Instances {
	t.Helper()
	var last hostapi.Instances
	done := false
	defer func() { // what it was, when the wait failed
		if !done {
			t.Logf("the desired instances of %s: %+v", n.Name, last)
		}
	}()
	computetest.Eventually(t, 20*time.Second, "the desired instances of "+n.Name+" as the test waits for", func() bool {
		ds := n.Converger.Last()
		last = hostapi.Instances{}
		for _, p := range ds.GetParts() {
			if p.Kind == hostapi.KindInstances {
				if p.Version != hostapi.InstancesVersion || !p.Optional {
					t.Fatalf("the part %s: version %d, optional %v", p.Kind, p.Version, p.Optional)
				}
				if err := json.Unmarshal(p.Payload, &last); err != nil {
					t.Fatal(err)
				}
			}
		}
		return ok(last)
	})
	done = true
	return last
}

func (f *fleet) reservations(t *testing.T) []api.Reservation {
	t.Helper()
	p, err := f.Compute.API.Reservations.List(f.ctx, f.RootKey, api.ListReservations{State: api.ReservationActive})
	if err != nil {
		t.Fatal(err)
	}
	return p.Items
}

// TestInstancesBookTheirCapacity: an instance's vCPUs, memory and GPUs are a reservation like any
// other, so an instance never takes what a reservation holds, nor a reservation what an instance
// holds; a placement on a node that is no VM host books nothing; concurrent creates on a host
// with room for four give exactly four.
func TestInstancesBookTheirCapacity(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	a, key := f.Compute.API, f.RootKey
	held, err := a.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "mixed", Shape: api.Shape{GPUs: 2}, RequireLabels: map[string]string{"vm": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.create("one", "gpu1"); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("an instance on a host whose GPUs a reservation holds: %v", err)
	}
	if _, err := a.Reservations.Release(f.ctx, key, api.ReleaseReservation{Reservation: held.ID}); err != nil {
		t.Fatal(err)
	}
	one, err := f.create("one", "gpu1")
	if err != nil {
		t.Fatal(err)
	}
	if one.NodeID != f.hostID || one.Power != vps.PowerRunning || one.Status != "pending" {
		t.Fatalf("the instance: %+v", one)
	}
	got := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 })
	if in := got.Instances[0]; in.ID != one.ID || len(in.GPUs) != 1 || in.VCPUs != 2 || in.MemoryMiB != 4096 || in.Power != "running" ||
		in.Kernel == nil || in.Kernel.SHA256 != strings.Repeat("a", 64) || in.Cmdline != "console=ttyS0" {
		t.Fatalf("the desired instance: %+v", in)
	}
	if _, err := a.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "mixed", Shape: api.Shape{GPUs: 2}, RequireLabels: map[string]string{"vm": "yes"}}); api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a reservation of the GPUs an instance holds one of: %v", err)
	}
	if _, err := f.create("one", "gpu1"); api.CodeOf(err) != api.CodeConflict || !strings.Contains(err.Error(), "one") {
		t.Fatalf("a second live instance named one: %v", err)
	}

	// Placed where no VM runtime runs: refused, and nothing is left booked.
	before := len(f.reservations(t))
	// Fill the VM host's vCPUs, so that "anywhere" lands on the other node.
	fill, err := a.Reservations.Create(f.ctx, key, api.CreateReservation{Pool: "mixed", Shape: api.Shape{VCPUs: 62}, RequireLabels: map[string]string{"vm": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.create("stray", "anywhere")
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "runs no VM runtime") {
		t.Fatalf("an instance placed on a node that is no VM host: %v", err)
	}
	if n := len(f.reservations(t)); n != before+1 {
		t.Fatalf("%d active reservations after a refused create, want %d", n, before+1)
	}
	if _, err := a.Reservations.Release(f.ctx, key, api.ReleaseReservation{Reservation: fill.ID}); err != nil {
		t.Fatal(err)
	}
	f.do(t, vps.InstancesDelete, one.ID)

	// 64 vCPUs: four instances of 16, however many ask at once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, refused := 0, 0
	for i := range 10 {
		wg.Go(func() {
			_, err := f.create(fmt.Sprintf("c%d", i), "cpu16")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made++
			case api.CodeOf(err) == api.CodeConflict:
				refused++
			default:
				t.Errorf("create c%d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if made != 4 || refused != 6 {
		t.Fatalf("%d made, %d refused; want 4 and 6", made, refused)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 4 })
}

// TestInstancePowerStatusAndEnd: power changes reach the host's desired state; a reboot only of
// a running instance, counted; the host's status reports become the instance's status with an
// event (another host's report of it is ignored); a delete releases the reservation and drops it
// from the host; an instance whose reservation is released by hand ends with it; a flavor in
// use is not removed.
func TestInstancePowerStatusAndEnd(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	a, key := f.Compute.API, f.RootKey
	i, err := f.create("web", "gpu1")
	if err != nil {
		t.Fatal(err)
	}
	f.do(t, vps.InstancesPause, i.ID)
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 && d.Instances[0].Power == "paused" })
	if _, err := f.call(vps.InstancesReboot, vps.InstanceRef{Instance: i.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a reboot of a paused instance: %v", err)
	}
	f.do(t, vps.InstancesStart, i.ID)
	f.do(t, vps.InstancesReboot, i.ID)
	f.do(t, vps.InstancesReboot, i.ID)
	f.desired(t, func(d hostapi.Instances) bool {
		return len(d.Instances) == 1 && d.Instances[0].Power == "running" && d.Instances[0].Reboots == 2
	})

	// The host reports; the other node's report of the instance changes nothing.
	var other *sim.Node
	for _, n := range f.nodes.Nodes {
		if n != f.host {
			other = n
		}
	}
	if err := other.Reports.Report(f.ctx, hostapi.KindStatus, hostapi.Status{Instances: []hostapi.InstanceStatus{{ID: i.ID, State: "error", Detail: "forged"}}}); err != nil {
		t.Fatal(err)
	}
	if got := f.do(t, vps.InstancesGet, i.ID); got.Status != "pending" {
		t.Fatalf("after another node's report: %s", got.Status)
	}
	if err := f.host.Reports.Report(f.ctx, hostapi.KindStatus, hostapi.Status{Instances: []hostapi.InstanceStatus{{ID: i.ID, State: "running", Reboots: 2}}}); err != nil {
		t.Fatal(err)
	}
	if got := f.do(t, vps.InstancesGet, i.ID); got.Status != "running" || got.StatusAt == nil {
		t.Fatalf("after its host's report: %+v", got)
	}
	var types string
	computetest.Eventually(t, 10*time.Second, "the instance's events", func() bool { // the log sequences them in the background
		evs, err := a.Events.List(f.ctx, key, api.ListEvents{Subject: i.ID})
		if err != nil {
			t.Fatal(err)
		}
		var ts []string
		for _, e := range evs.Items {
			ts = append(ts, e.Type)
		}
		types = strings.Join(ts, ",")
		return strings.Contains(types, vps.EventInstanceStatus)
	})
	if !strings.Contains(types, vps.EventInstanceCreated) || strings.Count(types, vps.EventInstanceStatus) != 1 {
		t.Fatalf("the instance's events: %s", types)
	}

	// In use, its flavor stays.
	if _, err := f.call(vps.FlavorsDelete, vps.FlavorRef{Flavor: "gpu1"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("deleting a flavor in use: %v", err)
	}
	gone := f.do(t, vps.InstancesDelete, i.ID)
	if gone.Status != "deleted" || gone.DeletedAt == nil {
		t.Fatalf("deleted: %+v", gone)
	}
	if again := f.do(t, vps.InstancesDelete, i.ID); again.DeletedAt == nil || !again.DeletedAt.Equal(*gone.DeletedAt) {
		t.Fatalf("deleted twice: %+v", again)
	}
	if r, err := a.Reservations.Get(f.ctx, key, api.GetReservation{Reservation: i.ReservationID}); err != nil || r.State == api.ReservationActive {
		t.Fatalf("its reservation: %v %v", r.State, err)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 0 })
	for _, m := range []api.Method[vps.InstanceRef, vps.Instance]{vps.InstancesStart, vps.InstancesStop, vps.InstancesReboot} {
		if _, err := f.call(m, vps.InstanceRef{Instance: i.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
			t.Fatalf("%s of a deleted instance: %v", m.Info().Name, err)
		}
	}
	if _, err := f.call(vps.InstancesConsole, vps.InstanceRef{Instance: i.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the console of a deleted instance: %v", err)
	}
	f.invoke(t, vps.FlavorsDelete, vps.FlavorRef{Flavor: "gpu1"})
	if _, err := f.create("again", "gpu1"); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("an instance of a deleted flavor: %v", err)
	}
	if got := f.do(t, vps.InstancesGet, i.ID); got.Flavor != "gpu1" {
		t.Fatalf("the deleted instance's flavor, after the flavor went: %q", got.Flavor)
	}
	f.invoke(t, vps.FlavorsCreate, vps.CreateFlavor{Name: "gpu1", VCPUs: 1, MemoryGiB: 1}) // the name is free again

	// Its reservation released by hand: the instance ends with it.
	j, err := f.create("db", "cpu16")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reservations.Release(f.ctx, key, api.ReleaseReservation{Reservation: j.ReservationID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 20*time.Second, "the instance ends with its reservation", func() bool {
		got := f.do(t, vps.InstancesGet, j.ID)
		return got.Status == "deleted" && got.DeletedReason == "reservation released"
	})
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 0 })
}

// TestBadInstanceInputIsNamed: each malformed input is refused with invalid_argument naming its
// field, and a reference to nothing with not_found; nothing is booked.
func TestBadInstanceInputIsNamed(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for _, c := range []struct {
		m     any
		in    any
		field string
	}{
		{vps.FlavorsCreate, vps.CreateFlavor{Name: "x", VCPUs: 0, MemoryGiB: 1}, "vcpus"},
		{vps.FlavorsCreate, vps.CreateFlavor{Name: "x", VCPUs: 1, MemoryGiB: 0}, "memoryGiB"},
		{vps.FlavorsCreate, vps.CreateFlavor{Name: "x", VCPUs: 1, MemoryGiB: 1, DiskGiB: -1}, "diskGiB"},
		{vps.FlavorsCreate, vps.CreateFlavor{Name: "bad name!", VCPUs: 1, MemoryGiB: 1}, "name"},
		{vps.VMImagesRegister, vps.RegisterVMImage{Name: "x"}, "kernel"},
		{vps.VMImagesRegister, vps.RegisterVMImage{Name: "x", Kernel: &vps.Artifact{URL: "file:///etc/shadow", SHA256: strings.Repeat("a", 64)}}, "kernel.url"},
		{vps.VMImagesRegister, vps.RegisterVMImage{Name: "x", Kernel: &vps.Artifact{URL: "https://x.test/k", SHA256: "nope"}}, "kernel.sha256"},
		{vps.VMImagesRegister, vps.RegisterVMImage{Name: "x", Disk: &vps.Artifact{URL: "https://x.test/d", SHA256: strings.Repeat("a", 64)}, Cmdline: "quiet"}, "cmdline"},
		{vps.InstancesCreate, vps.CreateInstance{Name: "x", Pool: "mixed", Flavor: "gpu1", Image: "guest", Power: "sideways"}, "power"},
		{vps.InstancesCreate, vps.CreateInstance{Name: "x", Pool: "mixed", Flavor: "gpu1", Image: "guest", Duration: "forever"}, "duration"},
		{vps.InstancesCreate, vps.CreateInstance{Name: "x", Pool: "", Flavor: "gpu1", Image: "guest"}, "pool"},
	} {
		_, err := f.call(c.m, c.in)
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", c.in, err, c.field)
		}
	}
	for _, in := range []vps.CreateInstance{
		{Name: "x", Pool: "mixed", Flavor: "nosuch", Image: "guest"},
		{Name: "x", Pool: "mixed", Flavor: "gpu1", Image: "nosuch"},
		{Name: "x", Pool: "nosuch", Flavor: "gpu1", Image: "guest"},
	} {
		if _, err := f.call(vps.InstancesCreate, in); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("%+v: %v, want not_found", in, err)
		}
	}
	if _, err := f.call(vps.InstancesGet, vps.InstanceRef{Instance: "0190a0b0-0000-7000-8000-00000000000a"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("an instance that does not exist: %v", err)
	}
	if n := len(f.reservations(t)); n != 0 {
		t.Fatalf("%d reservations after refused calls", n)
	}
}

// TestInstanceNetworksAndSeed: an instance's NICs lease addresses on the tenant's networks in its
// create's transaction (a network without room refuses the create, which books nothing), its
// host is sent each NIC and a NoCloud seed with the user-data and network config, instances.get
// shows the addresses and never the user-data, and a delete frees the addresses.
func TestInstanceNetworksAndSeed(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	key := f.RootKey
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.NetworksCreate, vps.CreateNetwork{Name: "lan", CIDR: "10.9.0.0/30", VLAN: 20}); err != nil {
		t.Fatal(err)
	}
	const secret = "#cloud-config\npassword: hunter2\n"
	i, err := compute.Invoke(f.ctx, f.Compute, key, vps.InstancesCreate, vps.CreateInstance{Name: "web", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Networks: []vps.InstanceNIC{{Network: "lan"}}, UserData: secret})
	if err != nil {
		t.Fatal(err)
	}
	got := f.do(t, vps.InstancesGet, i.ID)
	if len(got.NICs) != 1 || got.NICs[0].Addresses[0] != "10.9.0.2/30" || got.NICs[0].Gateway != "10.9.0.1" || got.NICs[0].VLAN != 20 {
		t.Fatalf("the instance's NICs: %+v", got.NICs)
	}
	if b, _ := json.Marshal(got); strings.Contains(string(b), "hunter2") {
		t.Fatalf("instances.get answers the user-data: %s", b)
	}
	d := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 })
	in := d.Instances[0]
	if len(in.NICs) != 1 || in.NICs[0].MAC != got.NICs[0].MAC || in.CloudInit == nil || in.CloudInit.UserData != secret ||
		!strings.Contains(in.CloudInit.NetworkConfig, "10.9.0.2/30") || !strings.Contains(in.CloudInit.MetaData, `local-hostname: "web"`) {
		t.Fatalf("the host's instance: %+v %+v", in.NICs, in.CloudInit)
	}

	// The /30 has one address for guests: a second instance is refused and books nothing.
	before := len(f.reservations(t))
	_, err = compute.Invoke(f.ctx, f.Compute, key, vps.InstancesCreate, vps.CreateInstance{Name: "db", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Networks: []vps.InstanceNIC{{Network: "lan"}}})
	if api.CodeOf(err) != api.CodeConflict || !strings.Contains(err.Error(), "lan") {
		t.Fatalf("an instance on a full network: %v", err)
	}
	if n := len(f.reservations(t)); n != before {
		t.Fatalf("%d reservations after a refused create, want %d", n, before)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.InstancesCreate, vps.CreateInstance{Name: "x", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Networks: []vps.InstanceNIC{{Network: "lan", Address: "192.168.0.1"}}}); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "networks[0].address") {
		t.Fatalf("a static address outside the network: %v", err)
	}

	f.do(t, vps.InstancesDelete, i.ID)
	leases, err := compute.Invoke(f.ctx, f.Compute, key, vps.NetworksAddresses, vps.ListAddresses{Network: "lan"})
	if err != nil || len(leases.Items) != 0 {
		t.Fatalf("leases after the delete: %+v %v", leases.Items, err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.InstancesCreate, vps.CreateInstance{Name: "db", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Networks: []vps.InstanceNIC{{Network: "lan"}}}); err != nil {
		t.Fatalf("an instance on the freed address: %v", err)
	}
}
