package metal_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
)

// TestMachineBatchesPassTheQuorum: wiping (machines.releaseMany) or redeploying
// (machines.deployMany) more of a site's machines than the tenant's policy allows waits for
// another principal's approval of that very batch, then runs it once; the percent is of the
// tenant's machines at the site. Two principals of the embedded IAM; no site agent is needed,
// as the runs only start here.
func TestMachineBatchesPassTheQuorum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := metal.New(metal.Options{JoinURL: "http://compute.test"})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	c := env.Compute
	key := func(name string) string {
		k, err := env.IAM.CreateAdminKey(ctx, computetest.RootTenantID, name)
		if err != nil {
			t.Fatal(err)
		}
		return k.Token
	}
	alice, bob := key("alice"), key("bob")
	must(t, func() error { _, err := c.API.Sites.Create(ctx, alice, api.CreateSite{Name: "fra1"}); return err })
	var names []string
	for i := range 4 {
		name := fmt.Sprintf("rack1-%02d", i)
		if _, err := compute.Invoke(ctx, c, alice, metal.MachinesCreate, metal.CreateMachine{Name: name, Site: "fra1",
			MACs: []string{fmt.Sprintf("52:54:00:00:01:%02x", i)}, BMC: metal.BMCInput{Driver: "ipmi", Address: fmt.Sprintf("10.0.0.%d:623", i+1), Username: "u", Password: "p"}}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if _, err := c.API.Quorum.Set(ctx, alice, api.SetQuorum{MaxPercent: 50}); err != nil {
		t.Fatal(err)
	}
	state := func(name string) string {
		t.Helper()
		got, err := compute.Invoke(ctx, c, alice, metal.MachinesGet, metal.MachineRef{Machine: name})
		if err != nil {
			t.Fatal(err)
		}
		return got.State
	}
	approvalOf := func(what string, err error) string {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeConfirmationRequired || ae.Details["approvalId"] == nil {
			t.Fatalf("%s: got %v, want confirmation_required with an approval", what, err)
		}
		return ae.Details["approvalId"].(string)
	}

	// Redeploying 3 of the site's 4 machines (75%) waits; the approval is bound to its image.
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesDeployMany, metal.DeployMachines{Machines: names[:3], Image: "tiny"})
	deployID := approvalOf("deploying 3 of 4", err)
	if _, err := c.API.Approvals.Approve(ctx, bob, api.DecideApproval{Approval: deployID}); err != nil {
		t.Fatal(err)
	}
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesDeployMany, metal.DeployMachines{Machines: names[:3], Image: "other", Approval: deployID})
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the deploy approval with another image = %v, want failed_precondition", err)
	}

	// Wiping 3 of 4 waits too, and nothing is wiped until bob approves.
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesReleaseMany, metal.ReleaseMachines{Machines: names[:3]})
	id := approvalOf("wiping 3 of 4", err)
	if id == deployID {
		t.Fatal("the wipe was given the deploy's approval")
	}
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesReleaseMany, metal.ReleaseMachines{Machines: names[:3], Approval: deployID})
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the wipe with the deploy's approval = %v, want failed_precondition", err)
	}
	if s := state(names[0]); s != metal.StateAvailable {
		t.Fatalf("before the approval, %s is %s", names[0], s)
	}
	if _, err := c.API.Approvals.Approve(ctx, alice, api.DecideApproval{Approval: id}); api.CodeOf(err) != api.CodePermissionDenied {
		t.Fatalf("alice approving her own wipe = %v, want permission_denied", err)
	}
	if _, err := c.API.Approvals.Approve(ctx, bob, api.DecideApproval{Approval: id}); err != nil {
		t.Fatal(err)
	}
	b, err := compute.Invoke(ctx, c, alice, metal.MachinesReleaseMany, metal.ReleaseMachines{Machines: []string{names[2], names[0], names[1]}, Approval: id})
	if err != nil {
		t.Fatal(err)
	}
	if b.Approval != id || len(b.Runs) != 3 || b.Runs[0].Machine.Name != names[2] || b.Runs[0].Run == "" {
		t.Fatalf("the wipe answered %+v", b)
	}
	for _, n := range names[:3] {
		if s := state(n); s != metal.StateReleasing {
			t.Fatalf("after the approved wipe, %s is %s", n, s)
		}
	}
	if s := state(names[3]); s != metal.StateAvailable {
		t.Fatalf("%s, not in the batch, is %s", names[3], s)
	}
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesReleaseMany, metal.ReleaseMachines{Machines: names[:3], Approval: id})
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the spent approval again = %v, want failed_precondition", err)
	}
	// Within the policy (1 of 4), no approval is asked for.
	_, err = compute.Invoke(ctx, c, alice, metal.MachinesReleaseMany, metal.ReleaseMachines{Machines: []string{names[3]}})
	if err != nil {
		t.Fatalf("wiping 1 of 4: %v", err)
	}
}
