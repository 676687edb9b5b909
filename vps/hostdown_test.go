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

// events are the types of a subject's events, in log order.
func (f *fleet) events(t *testing.T, subject string) []api.Event {
	t.Helper()
	evs, err := f.Compute.API.Events.List(f.ctx, f.RootKey, api.ListEvents{Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	return evs.Items
}

// hasEvent reports whether subject has an event of type typ whose data satisfies ok (nil: any).
func (f *fleet) hasEvent(t *testing.T, subject, typ string, ok func(map[string]any) bool) bool {
	t.Helper()
	return slices.ContainsFunc(f.events(t, subject), func(e api.Event) bool { return e.Type == typ && (ok == nil || ok(e.Data)) })
}

// onNode are the ids of the instances of a node's vps.instances part.
func onNode(d hostapi.Instances) []string {
	var ids []string
	for _, in := range d.Instances {
		ids = append(ids, in.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestUnreachableRuntimeMovesWork: a VM host whose runtime does not answer (its bcd says so in
// vps.host) is no place for VMs: nothing is placed on it though it has room, and none of its
// warm VMs is handed out. Its tenants' instances and sandboxes say so at once (status error, with
// an event); past the warm grace its warm VMs are replaced on another host, and past the grace
// its instances and sandboxes are lost (their reservations released, instance.lost and
// sandbox.lost). Once its runtime answers again, VMs are placed on it again. A VM host that goes
// offline has its warm VMs replaced too, and nothing of them stays booked.
func TestUnreachableRuntimeMovesWork(t *testing.T) {
	t.Parallel()
	f := newFleetWith(t, vps.Options{LostAfter: 2 * time.Second, WarmLostAfter: time.Second})
	a, key := f.Compute.API, f.RootKey
	other := f.nodes.Nodes[1]
	otherID := other.NodeID()

	// On the VM host, alone yet: an instance, a sandbox and a warm pool of two, paused (64 vCPUs
	// hold four of 16: the host is full).
	web, err := f.create("web", "cpu16")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "py", Pool: "mixed", Flavor: "cpu16",
		Image: "guest", Warm: 2, Warmup: "1s"}); err != nil {
		t.Fatal(err)
	}
	warmUp := func(n *sim.Node, count int) {
		t.Helper()
		f.reportAsAskedBy(t, n, f.desiredOf(t, n, func(d hostapi.Instances) bool { return len(d.Instances) == count }))
		computetest.Eventually(t, 20*time.Second, "the warm pool waits paused", func() bool {
			tmpl, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesGet, vps.SandboxTemplateRef{Template: "py"})
			if err != nil {
				t.Fatal(err)
			}
			f.reportAsAskedBy(t, n, f.desiredOf(t, n, func(hostapi.Instances) bool { return true }))
			return tmpl.WarmReady == 2 && tmpl.WarmBooting == 0
		})
	}
	warmUp(f.host, 3)
	old, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "py", Name: "old"})
	if err != nil || !old.FromWarmPool || old.NodeID != f.hostID {
		t.Fatalf("a sandbox from the warm pool: %+v %v", old, err)
	}
	warmUp(f.host, 4)

	// The other node becomes a VM host too, with room for all four.
	if err := other.Reports.Report(f.ctx, hostapi.KindHost, hostapi.Host{Runtime: "libvirt-kvm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Nodes.SetLabels(f.ctx, key, api.SetNodeLabels{NodeRef: api.NodeRef{Pool: "mixed", Node: other.Name}, Labels: map[string]string{"vm": "yes"}}); err != nil {
		t.Fatal(err)
	}

	// The first host's libvirtd stops answering.
	const why = "libvirt: connect to qemu:///system at /run/libvirt/libvirt-sock: dial unix /run/libvirt/libvirt-sock: connect: connection refused"
	if err := f.host.Reports.Report(f.ctx, hostapi.KindHost, hostapi.Host{Runtime: "libvirt-kvm", Unreachable: why}); err != nil {
		t.Fatal(err)
	}
	// Nothing goes to it, nor comes from its warm pool: a sandbox boots cold on the other host,
	// and an instance lands there too (freed room on the first would fit it tighter).
	job, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "py", Name: "job"})
	if err != nil || job.FromWarmPool || job.NodeID != otherID {
		t.Fatalf("a sandbox while the warm VMs' host cannot reach its runtime: %+v %v", job, err)
	}
	api2, err := f.create("api", "cpu16")
	if err != nil || api2.NodeID != otherID {
		t.Fatalf("an instance while a VM host cannot reach its runtime: %+v %v", api2, err)
	}
	computetest.Eventually(t, 10*time.Second, "the host's events", func() bool {
		return f.hasEvent(t, f.hostID, vps.EventVMHostRuntimeDown, func(d map[string]any) bool { return d["detail"] == why })
	})

	// Its tenants hear at once, without the host's details; past the grace their instance and
	// sandbox are lost.
	for _, c := range []struct{ id, status, lost string }{{web.ID, vps.EventInstanceStatus, vps.EventInstanceLost}, {old.ID, vps.EventSandboxStatus, vps.EventSandboxLost}} {
		computetest.Eventually(t, 20*time.Second, "lost: "+c.id, func() bool {
			return f.hasEvent(t, c.id, c.status, func(d map[string]any) bool {
				// The tenant hears what happened, not the host's paths (the operator's event has them).
				return d["status"] == "error" && d["detail"] == "its host cannot reach its VM runtime"
			}) && f.hasEvent(t, c.id, c.lost, nil)
		})
	}
	if got := f.do(t, vps.InstancesGet, web.ID); got.DeletedAt == nil || !strings.HasPrefix(got.DeletedReason, "lost") {
		t.Fatalf("the instance of the lost host: %+v", got)
	}
	for _, r := range []string{web.ReservationID, old.ReservationID} {
		if got, err := a.Reservations.Get(f.ctx, key, api.GetReservation{Reservation: r}); err != nil || got.State == api.ReservationActive {
			t.Fatalf("the reservation of lost work: %s %v", got.State, err)
		}
	}
	// Its warm VMs are replaced on the other host, which is full then; the first keeps nothing.
	f.desiredOf(t, other, func(d hostapi.Instances) bool { return len(d.Instances) == 4 })
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 0 })
	warmUp(other, 4)

	// Its runtime answers again: it takes VMs again.
	if err := f.host.Reports.Report(f.ctx, hostapi.KindHost, hostapi.Host{Runtime: "libvirt-kvm"}); err != nil {
		t.Fatal(err)
	}
	db, err := f.create("db", "cpu16")
	if err != nil || db.NodeID != f.hostID {
		t.Fatalf("an instance once the host's runtime came back: %+v %v", db, err)
	}
	computetest.Eventually(t, 10*time.Second, "the host's events", func() bool { return f.hasEvent(t, f.hostID, vps.EventVMHostRuntimeUp, nil) })

	// The other host goes offline: its warm VMs are replaced on the first; its tenants' sandbox
	// and instance stay theirs, and nothing but live work is booked.
	warm := slices.DeleteFunc(onNode(f.desiredOf(t, other, func(hostapi.Instances) bool { return true })), func(id string) bool {
		return id == job.ID || id == api2.ID
	})
	if len(warm) != 2 {
		t.Fatalf("the other host's warm VMs: %v", warm)
	}
	other.Disconnect()
	d := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 3 })
	if ids := onNode(d); slices.ContainsFunc(warm, func(id string) bool { return slices.Contains(ids, id) }) {
		t.Fatalf("the offline host's warm VMs %v, on the first host: %v", warm, ids)
	}
	if got := f.do(t, vps.InstancesGet, api2.ID); got.DeletedAt != nil {
		t.Fatalf("an instance of the offline host: %+v", got)
	}
	if got := f.sandbox(t, vps.SandboxesGet, job.ID); got.DeletedAt != nil {
		t.Fatalf("a sandbox of the offline host: %+v", got)
	}
	tmpl, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesGet, vps.SandboxTemplateRef{Template: "py"})
	if err != nil || tmpl.WarmReady+tmpl.WarmBooting != 2 {
		t.Fatalf("the template: %+v %v", tmpl, err)
	}
	if held := len(f.reservations(t)); held != 5 { // db, api, job and two warm VMs on the first host
		t.Fatalf("%d active reservations, want 5", held)
	}
}
