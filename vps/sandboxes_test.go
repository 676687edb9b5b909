package vps_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/sim"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/hostapi"
)

func (f *fleet) sandbox(t *testing.T, m api.Method[vps.SandboxRef, vps.Sandbox], id string) vps.Sandbox {
	t.Helper()
	s, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, m, vps.SandboxRef{Sandbox: id})
	if err != nil {
		t.Fatalf("%s %s: %v", m.Info().Name, id, err)
	}
	return s
}

// report says, as the host would, what it has of each instance it is asked to run: asked
// running or paused, it is so.
func (f *fleet) reportAsAsked(t *testing.T, d hostapi.Instances) {
	t.Helper()
	f.reportAsAskedBy(t, f.host, d)
}

// reportAsAskedBy is reportAsAsked by node n.
func (f *fleet) reportAsAskedBy(t *testing.T, n *sim.Node, d hostapi.Instances) {
	t.Helper()
	st := hostapi.Status{}
	for _, in := range d.Instances {
		st.Instances = append(st.Instances, hostapi.InstanceStatus{ID: in.ID, State: in.Power, Reboots: in.Reboots, Snapshots: in.Snapshots})
	}
	if err := n.Reports.Report(f.ctx, hostapi.KindStatus, st); err != nil {
		t.Fatal(err)
	}
}

func powers(d hostapi.Instances) []string {
	var p []string
	for _, in := range d.Instances {
		p = append(p, in.Power)
	}
	slices.Sort(p)
	return p
}

// TestWarmPoolsTTLAndTemplates: a template's warm pool fills with booted instances that are
// paused once they have run their warmup; a sandbox takes one (resumed, not booted) and the pool
// refills; with no warm one left and no room, a create is refused and books nothing; a sandbox
// expires with its TTL (sandbox.expired, its reservation released), is extended only within its
// template's maxTTL; a template with live sandboxes stays, and without them goes with its warm
// instances.
func TestWarmPoolsTTLAndTemplates(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	a, key := f.Compute.API, f.RootKey
	tmpl, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "py", Pool: "mixed", Flavor: "cpu16",
		Image: "guest", Env: map[string]string{"LANG": "C.UTF-8"}, Warm: 2, Warmup: "1s", TTL: "1h", MaxTTL: "2h"})
	if err != nil {
		t.Fatal(err)
	}
	// Booted, run, then paused: two wait.
	d := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 2 })
	if d.Instances[0].Env["LANG"] != "C.UTF-8" || d.Instances[0].Power != "running" {
		t.Fatalf("a warm instance booting: %+v", d.Instances[0])
	}
	f.reportAsAsked(t, d)
	d = f.desired(t, func(d hostapi.Instances) bool { return slices.Equal(powers(d), []string{"paused", "paused"}) })
	f.reportAsAsked(t, d)
	got, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesGet, vps.SandboxTemplateRef{Template: "py"})
	if err != nil || got.WarmReady != 2 || got.WarmBooting != 0 {
		t.Fatalf("the template: %+v, %v", got, err)
	}
	if list, err := compute.Invoke(f.ctx, f.Compute, key, vps.InstancesList, vps.ListInstances{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("warm instances are not the tenant's instances: %+v, %v", list.Items, err)
	}

	// A sandbox takes a warm one; the pool boots another.
	sb, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "py", Name: "job1"})
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromWarmPool || sb.Power != "running" || sb.Name != "job1" || sb.TemplateID != tmpl.ID || time.Until(sb.ExpiresAt) < 59*time.Minute {
		t.Fatalf("the sandbox: %+v", sb)
	}
	d = f.desired(t, func(d hostapi.Instances) bool {
		return slices.Equal(powers(d), []string{"paused", "running", "running"})
	})
	f.reportAsAsked(t, d)
	// 64 vCPUs hold four of 16: the fourth is the refill; a cold one finds no room and books nothing.
	d = f.desired(t, func(d hostapi.Instances) bool {
		return len(d.Instances) == 3 && slices.Equal(powers(d), []string{"paused", "paused", "running"})
	})
	f.reportAsAsked(t, d)
	second, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "py", TTL: "1s"})
	if err != nil || !second.FromWarmPool || !strings.HasPrefix(second.Name, "sbx-") {
		t.Fatalf("a second sandbox: %+v, %v", second, err)
	}
	// Sandboxes until the host is full (64 vCPUs hold four of 16, warm ones included): the one
	// refused books nothing.
	var refused error
	for range 6 {
		if _, refused = compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "py"}); refused != nil {
			break
		}
	}
	if api.CodeOf(refused) != api.CodeConflict {
		t.Fatalf("a sandbox beyond the host's room: %v", refused)
	}
	sbs, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesList, vps.ListSandboxes{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesGet, vps.SandboxTemplateRef{Template: "py"})
	if err != nil {
		t.Fatal(err)
	}
	if held, n := len(f.reservations(t)), len(sbs.Items)+pool.WarmReady+pool.WarmBooting; held != 4 || n != 4 {
		t.Fatalf("a full host: %d reservations, %d sandboxes and warm instances; want 4 of each", held, n)
	}

	// The one with a TTL of a second expires.
	computetest.Eventually(t, 20*time.Second, "the sandbox expires", func() bool {
		s := f.sandbox(t, vps.SandboxesGet, second.ID)
		return s.Status == "deleted" && s.DeletedReason == "expired"
	})
	if r, err := a.Reservations.Get(f.ctx, key, api.GetReservation{Reservation: second.ReservationID}); err != nil || r.State == api.ReservationActive {
		t.Fatalf("the expired sandbox's reservation: %s %v", r.State, err)
	}
	computetest.Eventually(t, 10*time.Second, "sandbox.expired", func() bool {
		evs, err := a.Events.List(f.ctx, key, api.ListEvents{Subject: second.ID, Type: vps.EventSandboxExpired})
		return err == nil && len(evs.Items) == 1
	})

	// Extended within the template's maxTTL of its creation, not past it.
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesExtend, vps.ExtendSandbox{SandboxRef: vps.SandboxRef{Sandbox: "job1"}, TTL: "3h"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("an extension past maxTTL: %v", err)
	}
	ext, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesExtend, vps.ExtendSandbox{SandboxRef: vps.SandboxRef{Sandbox: "job1"}, TTL: "90m"})
	if err != nil || time.Until(ext.ExpiresAt) < 89*time.Minute {
		t.Fatalf("an extension: %+v %v", ext.ExpiresAt, err)
	}
	// Paused and resumed as asked.
	f.sandbox(t, vps.SandboxesPause, "job1")
	f.desired(t, func(d hostapi.Instances) bool {
		return slices.ContainsFunc(d.Instances, func(in hostapi.Instance) bool { return in.ID == sb.ID && in.Power == "paused" })
	})
	f.sandbox(t, vps.SandboxesResume, "job1")

	// A sandbox is no instance: instances.* does not reach it.
	if _, err := f.call(vps.InstancesStop, vps.InstanceRef{Instance: sb.ID}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("instances.stop of a sandbox: %v", err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesDelete, vps.SandboxTemplateRef{Template: "py"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("deleting a template with live sandboxes: %v", err)
	}
	list, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesList, vps.ListSandboxes{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		f.sandbox(t, vps.SandboxesDelete, s.ID)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesDelete, vps.SandboxTemplateRef{Template: "py"}); err != nil {
		t.Fatal(err)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 0 })
	if n := len(f.reservations(t)); n != 0 {
		t.Fatalf("%d reservations left after the template went", n)
	}
}

// TestSnapshotsFollowTheHost: a snapshot is asked of the host through the desired state, is
// ready when the host has it and failed when the host says it could not; a restore is asked
// once per call; a deleted snapshot leaves the desired state; a snapshot of an ended sandbox,
// or a restore of one not ready, is refused.
func TestSnapshotsFollowTheHost(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	key := f.RootKey
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "t", Pool: "mixed", Flavor: "cpu16", Image: "guest"}); err != nil {
		t.Fatal(err)
	}
	sb, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "t", Name: "s"})
	if err != nil || sb.FromWarmPool {
		t.Fatalf("a cold sandbox: %+v %v", sb, err)
	}
	snap := func(name string) vps.Snapshot {
		t.Helper()
		s, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsCreate, vps.CreateSnapshot{SandboxRef: vps.SandboxRef{Sandbox: "s"}, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good, bad := snap("good"), snap("bad")
	if good.Status != "pending" {
		t.Fatalf("a new snapshot: %+v", good)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsRestore, vps.SnapshotRef{Snapshot: good.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a restore of a pending snapshot: %v", err)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 && len(d.Instances[0].Snapshots) == 2 })
	if err := f.host.Reports.Report(f.ctx, hostapi.KindStatus, hostapi.Status{Instances: []hostapi.InstanceStatus{{ID: sb.ID, State: "running",
		Snapshots: []string{good.ID}, SnapshotErrors: map[string]string{bad.ID: "disk full"}}}}); err != nil {
		t.Fatal(err)
	}
	list, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsList, vps.ListSnapshots{SandboxRef: vps.SandboxRef{Sandbox: "s"}})
	if err != nil || len(list.Items) != 2 || list.Items[0].Status != "ready" || list.Items[1].Status != "failed" || list.Items[1].StatusDetail != "disk full" {
		t.Fatalf("the snapshots after the host's report: %+v %v", list.Items, err)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances[0].Snapshots) == 1 }) // a failed one is no longer asked for
	for want := 1; want <= 2; want++ {
		if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsRestore, vps.SnapshotRef{Snapshot: good.ID}); err != nil {
			t.Fatal(err)
		}
		f.desired(t, func(d hostapi.Instances) bool {
			r := d.Instances[0].Restore
			return r != nil && r.Snapshot == good.ID && r.Serial == want
		})
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsDelete, vps.SnapshotRef{Snapshot: good.ID}); err != nil {
		t.Fatal(err)
	}
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances[0].Snapshots) == 0 })
	f.sandbox(t, vps.SandboxesDelete, "s")
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxSnapshotsCreate, vps.CreateSnapshot{SandboxRef: vps.SandboxRef{Sandbox: sb.ID}, Name: "late"}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a snapshot of an ended sandbox: %v", err)
	}
}

// TestBadSandboxInputIsNamed: malformed templates and sandboxes are refused naming the field.
func TestBadSandboxInputIsNamed(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ok := vps.CreateSandboxTemplate{Name: "t", Pool: "mixed", Flavor: "cpu16", Image: "guest"}
	for _, c := range []struct {
		change func(*vps.CreateSandboxTemplate)
		field  string
	}{
		{func(in *vps.CreateSandboxTemplate) { in.TTL, in.MaxTTL = "2h", "1h" }, "maxTTL"},
		{func(in *vps.CreateSandboxTemplate) { in.TTL = "soon" }, "ttl"},
		{func(in *vps.CreateSandboxTemplate) { in.Warm = vps.MaxWarm + 1 }, "warm"},
		{func(in *vps.CreateSandboxTemplate) { in.Warmup = "2h" }, "warmup"},
		{func(in *vps.CreateSandboxTemplate) { in.Network = strings.Repeat("n", 254) }, "network"},
		{func(in *vps.CreateSandboxTemplate) { in.Env = map[string]string{"1BAD": "x"} }, "env"},
		{func(in *vps.CreateSandboxTemplate) { in.Env = map[string]string{"OK": strings.Repeat("x", 5000)} }, "env.OK"},
	} {
		in := ok
		c.change(&in)
		if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, vps.SandboxTemplatesCreate, in); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want invalid_argument naming %s", in, err, c.field)
		}
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, vps.SandboxTemplatesCreate, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, vps.SandboxesCreate, vps.CreateSandbox{Template: "t", TTL: "48h"}); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "maxTTL") {
		t.Errorf("a ttl past the template's maxTTL: %v", err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, f.RootKey, vps.SandboxesCreate, vps.CreateSandbox{Template: "nosuch"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("a sandbox of no template: %v", err)
	}
	if n := len(f.reservations(t)); n != 0 {
		t.Fatalf("%d reservations after refused calls", n)
	}
}

// TestSandboxesOnANetwork: a template's network policy names a network of the tenant: each of its
// sandboxes gets a NIC with an address there (its seed says so), freed with the sandbox; a
// network that does not exist is not found.
func TestSandboxesOnANetwork(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	key := f.RootKey
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "t", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Network: "nosuch"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("a template on a network that does not exist: %v", err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.NetworksCreate, vps.CreateNetwork{Name: "lan", CIDR: "10.7.0.0/24"}); err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "t", Pool: "mixed", Flavor: "cpu16", Image: "guest",
		Network: "lan"}); err != nil {
		t.Fatal(err)
	}
	sb, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "t", Name: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.NICs) != 1 || sb.NICs[0].Addresses[0] != "10.7.0.2/24" {
		t.Fatalf("the sandbox's NICs: %+v", sb.NICs)
	}
	d := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 })
	if in := d.Instances[0]; len(in.NICs) != 1 || in.CloudInit == nil || !strings.Contains(in.CloudInit.NetworkConfig, "10.7.0.2/24") {
		t.Fatalf("the host's sandbox: %+v %+v", in.NICs, in.CloudInit)
	}
	f.sandbox(t, vps.SandboxesDelete, "s")
	leases, err := compute.Invoke(f.ctx, f.Compute, key, vps.NetworksAddresses, vps.ListAddresses{Network: "lan"})
	if err != nil || len(leases.Items) != 0 {
		t.Fatalf("leases after the sandbox went: %+v %v", leases.Items, err)
	}
}
