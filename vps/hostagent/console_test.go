package hostagent

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/runtime"
)

// consoleRuntime makes each instance's console and second port as files, as a runtime makes
// their sockets.
type consoleRuntime struct{ made map[string]runtime.Instance }

func (consoleRuntime) Name() string { return "console-test" }
func (r consoleRuntime) List(context.Context) ([]runtime.Status, error) {
	var out []runtime.Status
	for id := range r.made {
		out = append(out, runtime.Status{ID: id, State: runtime.PowerRunning})
	}
	return out, nil
}
func (r consoleRuntime) Ensure(_ context.Context, in runtime.Instance) (runtime.Status, error) {
	r.made[in.ID] = in
	for _, p := range []string{in.Console, in.Agent} {
		if p != "" {
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				return runtime.Status{}, err
			}
		}
	}
	return runtime.Status{ID: in.ID, State: runtime.PowerRunning}, nil
}
func (consoleRuntime) Reboot(context.Context, string) error { return nil }
func (r consoleRuntime) Delete(_ context.Context, id string) error {
	delete(r.made, id)
	return nil
}
func (consoleRuntime) Save(context.Context, string, string) error { return nil }
func (consoleRuntime) Restore(context.Context, string, runtime.Instance) (runtime.Status, error) {
	return runtime.Status{}, nil
}

type noReports struct{}

func (noReports) Report(context.Context, string, any) error { return nil }

// TestConsolesServeTheirOwnersAlone: whatever console name and reservation a ticket carries,
// the host serves an instance's console (or second port) only to the reservation the
// instance's desired state names; none to an operator's ticket (no reservation), to another
// reservation, or to a name that is not one of its instances'. A property over names, owners
// and askers.
func TestConsolesServeTheirOwnersAlone(t *testing.T) {
	t.Parallel()
	a, err := New(Options{Runtime: consoleRuntime{made: map[string]runtime.Instance{}}, Dir: t.TempDir(), Reporter: noReports{}})
	if err != nil {
		t.Fatal(err)
	}
	x := a.Extension()
	converge := x.Desired[hostapi.KindInstances]
	ids := []string{"i-1", "i-2", "i-3", "i-4"}
	reservations := []string{"", "res-a", "res-b", "res-c"}
	rapid.Check(t, func(rt *rapid.T) {
		owners := map[string]string{}
		var want hostapi.Instances
		for _, id := range ids {
			if !rapid.Bool().Draw(rt, "runs "+id) {
				continue
			}
			owner := rapid.SampledFrom(reservations).Draw(rt, "owner of "+id)
			owners[id] = owner
			want.Instances = append(want.Instances, hostapi.Instance{ID: id, Reservation: owner, Power: runtime.PowerRunning,
				Agent: rapid.Bool().Draw(rt, "agent of "+id)})
		}
		payload, _ := json.Marshal(want)
		if err := converge(context.Background(), hostapi.InstancesVersion, payload); err != nil {
			rt.Fatal(err)
		}
		id := rapid.SampledFrom(append(ids, "../i-1", "i-1/../i-2", "")).Draw(rt, "id")
		name := rapid.SampledFrom([]string{hostapi.ConsoleName(id), hostapi.AgentName(id), id, "node"}).Draw(rt, "name")
		asker := rapid.SampledFrom(reservations).Draw(rt, "asker")
		path, ok := x.Console(name, asker)
		owner, runs := owners[id]
		mine := runs && asker != "" && owner == asker
		if ok && (!mine || name != hostapi.ConsoleName(id) && name != hostapi.AgentName(id)) {
			rt.Fatalf("console %q served to reservation %q (instance runs %v, owned by %q): %s", name, asker, runs, owner, path)
		}
		if !ok && mine && name == hostapi.ConsoleName(id) {
			rt.Fatalf("instance %s's console not served to its own reservation %q", id, asker)
		}
	})
}

// TestHypervisorSocketsAreTheAgentsAlone: the hypervisor makes an instance's console and second
// port as it likes (a Unix socket's mode follows its umask); whoever can connect to one has the
// guest's console, or answers the guest's SSH challenge with no revocations. A local user of
// the host (a holder's confined user) must not: once the instance is converged, both are 0600,
// bcd's (root) and the hypervisor's own.
func TestHypervisorSocketsAreTheAgentsAlone(t *testing.T) {
	t.Parallel()
	rt := openRuntime{consoleRuntime{made: map[string]runtime.Instance{}}}
	a, err := New(Options{Runtime: rt, Dir: t.TempDir(), Reporter: noReports{}})
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(hostapi.Instances{Instances: []hostapi.Instance{{ID: "i-1", Reservation: "res-a", Power: runtime.PowerRunning, Agent: true}}})
	if err := a.Extension().Desired[hostapi.KindInstances](context.Background(), hostapi.InstancesVersion, payload); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a.consolePath("i-1"), a.guestPortPath("i-1")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v once converged, want 0600", p, fi.Mode().Perm())
		}
	}
}

// openRuntime makes the instances' sockets as a hypervisor with umask 0 would: open to all.
type openRuntime struct{ consoleRuntime }

func (r openRuntime) Ensure(ctx context.Context, in runtime.Instance) (runtime.Status, error) {
	st, err := r.consoleRuntime.Ensure(ctx, in)
	for _, p := range []string{in.Console, in.Agent} {
		if p != "" && err == nil {
			err = os.Chmod(p, 0o666)
		}
	}
	return st, err
}
