package metal_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/metal/ipmi/ipmisim"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestMachinesArePoweredThroughTheirBMCAsWorkflows registers a machine whose BMC is OpenIPMI's
// simulator, over real HTTP, and powers it on and off through the API: each is a workflow run
// whose steps reach the BMC with the sealed password, and the machine's recorded power and the
// chassis agree. The password is never answered, nor stored in the clear.
func TestMachinesArePoweredThroughTheirBMCAsWorkflows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, dir := ipmisim.Start(t)
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	url := env.Server(t)
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	bmc := metal.BMCInput{Driver: "ipmi", Address: b.Address, Username: ipmisim.Username, Password: ipmisim.Password}
	mach, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "rack1-u07", BMC: bmc})
	if err != nil {
		t.Fatal(err)
	}
	if !mach.BMC.PasswordSet || mach.Power != "unknown" {
		t.Errorf("created %+v", mach)
	}

	for _, step := range []struct{ action, want string }{{"on", "on"}, {"off", "off"}} {
		pr, err := client.Call(ctx, cl, metal.MachinesPower, metal.PowerMachine{Machine: "rack1-u07", Action: step.action})
		if err != nil {
			t.Fatal(err)
		}
		var run api.WorkflowRun
		computetest.Eventually(t, 30*time.Second, "the power "+step.action+" run to end", func() bool {
			if run, err = cl.Workflows.Get(ctx, api.GetWorkflow{Run: pr.Run}); err != nil {
				t.Fatal(err)
			}
			return run.State != api.WorkflowRunning
		})
		if run.State != api.WorkflowSucceeded || run.Subject != mach.ID {
			t.Fatalf("power %s: run %+v", step.action, run)
		}
		got, err := client.Call(ctx, cl, metal.MachinesGet, metal.MachineRef{Machine: mach.ID})
		if err != nil || got.Power != step.want || got.PowerCheckedAt == nil {
			t.Fatalf("after power %s the machine is %+v, %v", step.action, got, err)
		}
	}
	if got, want := ipmisim.Log(t, dir), []string{"power 1", "power 0"}; !slices.Equal(got, want) {
		t.Errorf("the chassis was told %q, want %q", got, want)
	}

	// The password is write-only: no answer carries it, and the table holds it sealed.
	for _, path := range []string{"machines/get", "machines/list"} {
		req, _ := http.NewRequest(http.MethodPost, url+"/api/compute/"+path, strings.NewReader(`{"machine":"rack1-u07"}`))
		if path == "machines/list" {
			req, _ = http.NewRequest(http.MethodPost, url+"/api/compute/"+path, strings.NewReader(`{}`))
		}
		req.Header.Set("Authorization", "Bearer "+env.RootKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || bytes.Contains(body, []byte(ipmisim.Password)) {
			t.Errorf("%s answered %d %s: the password must never be in an answer", path, resp.StatusCode, body)
		}
	}
	var sealed []byte
	if err := env.DB.Pool.QueryRow(ctx, `SELECT bmc_password FROM compute.metal_machines WHERE id = $1`, mach.ID).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(ipmisim.Password)) {
		t.Error("the BMC password is stored in the clear")
	}

	// A wrong password fails the run with the BMC's refusal; a driver nobody registered, an
	// address the driver cannot dial and a taken name are refused at once.
	bad := bmc
	bad.Password = "guess"
	if _, err := client.Call(ctx, cl, metal.MachinesSetBMC, metal.SetMachineBMC{Machine: mach.ID, BMC: bad}); err != nil {
		t.Fatal(err)
	}
	pr, err := client.Call(ctx, cl, metal.MachinesPower, metal.PowerMachine{Machine: mach.ID, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	var run api.WorkflowRun
	computetest.Eventually(t, 60*time.Second, "the power run with a wrong password to end", func() bool {
		if run, err = cl.Workflows.Get(ctx, api.GetWorkflow{Run: pr.Run}); err != nil {
			t.Fatal(err)
		}
		return run.State != api.WorkflowRunning
	})
	if run.State != api.WorkflowFailed || !strings.Contains(run.Error, "connect") {
		t.Errorf("with a wrong password the run is %s saying %q, want failed with the BMC's refusal", run.State, run.Error)
	}
	for _, c := range []struct {
		in    metal.CreateMachine
		field string
	}{
		{metal.CreateMachine{Name: "x", BMC: metal.BMCInput{Driver: "smash", Address: "h:623", Username: "u", Password: "p"}}, "bmc.driver"},
		{metal.CreateMachine{Name: "x", BMC: metal.BMCInput{Driver: "ipmi", Address: "nohost", Username: "u", Password: "p"}}, "bmc.address"},
		{metal.CreateMachine{Name: "x", BMC: metal.BMCInput{Driver: "redfish", Address: "10.0.0.1:443", Username: "u", Password: "p"}}, "bmc.address"},
		{metal.CreateMachine{Name: "x", BMC: metal.BMCInput{Driver: "ipmi", Address: "h:623", Username: "u"}}, "bmc.password"},
	} {
		if _, err := client.Call(ctx, cl, metal.MachinesCreate, c.in); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("create %+v: %v, want invalid_argument naming %s", c.in, err, c.field)
		}
	}
	if _, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "rack1-u07", BMC: bmc}); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("a second machine of the same name: %v, want conflict", err)
	}
}

// TestImagesAreRegisteredWithTheirChecksum checks images' validation and lifecycle.
func TestImagesAreRegisteredWithTheirChecksum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}})
	cl, err := client.New(env.Server(t), client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("ab", 32)
	img, err := client.Call(ctx, cl, metal.ImagesRegister, metal.RegisterImage{Name: "debian-13", URL: "https://images.example.com/debian-13.raw", Format: "raw", SizeBytes: 2 << 30, SHA256: sum})
	if err != nil || img.SHA256 != sum {
		t.Fatalf("register = %+v, %v", img, err)
	}
	for _, c := range []struct {
		in    metal.RegisterImage
		field string
	}{
		{metal.RegisterImage{Name: "a", URL: "ftp://x/y", Format: "raw", SizeBytes: 1, SHA256: sum}, "url"},
		{metal.RegisterImage{Name: "a", URL: "https://x/y", Format: "iso", SizeBytes: 1, SHA256: sum}, "format"},
		{metal.RegisterImage{Name: "a", URL: "https://x/y", Format: "raw", SizeBytes: 0, SHA256: sum}, "sizeBytes"},
		{metal.RegisterImage{Name: "a", URL: "https://x/y", Format: "raw", SizeBytes: 1, SHA256: strings.ToUpper(sum)}, "sha256"},
	} {
		if _, err := client.Call(ctx, cl, metal.ImagesRegister, c.in); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), c.field) {
			t.Errorf("register %+v: %v, want invalid_argument naming %s", c.in, err, c.field)
		}
	}
	if _, err := client.Call(ctx, cl, metal.ImagesRegister, metal.RegisterImage{Name: "debian-13", URL: "https://x/y", Format: "tar", SizeBytes: 1, SHA256: sum}); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("a taken name: %v, want conflict", err)
	}
	list, err := client.Call(ctx, cl, metal.ImagesList, metal.ListImages{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if _, err := client.Call(ctx, cl, metal.ImagesDelete, metal.ImageRef{Image: "debian-13"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, cl, metal.ImagesDelete, metal.ImageRef{Image: "debian-13"}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("delete again: %v, want not_found", err)
	}
}

// TestJoinRequestsAreApprovedIntoMachines: a machine that asks to join (as a site agent reports
// it) is one pending request however often it asks; approving it enrolls it as a machine with
// its facts, once; rejecting records why; another tenant sees none of it.
func TestJoinRequestsAreApprovedIntoMachines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The BMCs are on 10.0.0.0/8, which the operator allows: a machine registered by its BMC
	// alone has no site yet, so the control plane dials its BMC itself.
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}, Configure: func(o *compute.Options) {
		o.Outbound.Allow = append(o.Outbound.Allow, netip.MustParsePrefix("10.0.0.0/8"))
	}})
	url := env.Server(t)
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Compute.API.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "fra1"}); err != nil {
		t.Fatal(err)
	}
	submit := func(f metal.Facts) (metal.JoinRequest, error) {
		var r metal.JoinRequest
		err := env.DB.Tx(ctx, func(tx pgx.Tx) error {
			var err error
			r, err = metal.SubmitJoinRequest(ctx, tx, env.Compute.Runtime(), computetest.RootTenantID, "fra1", f)
			return err
		})
		return r, err
	}
	facts := metal.Facts{Serial: "SN-0042", MACs: []string{"52:54:00:12:34:56"}, BMCAddress: "10.0.0.42", CPUs: 64, MemoryGiB: 512}
	first, err := submit(facts)
	if err != nil {
		t.Fatal(err)
	}
	facts.MemoryGiB = 1024 // it booted again, with more memory
	again, err := submit(facts)
	if err != nil || again.ID != first.ID || again.Facts.MemoryGiB != 1024 {
		t.Fatalf("a second report: %+v, %v; want the same request, refreshed", again, err)
	}
	if _, err := submit(metal.Facts{Serial: "SN-1", MACs: []string{"52:54:00:AA:BB:CC"}}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("an uppercase MAC: %v, want invalid_argument", err)
	}
	list, err := client.Call(ctx, cl, metal.JoinRequestsList, metal.ListJoinRequests{State: "pending"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("pending requests = %+v, %v", list.Items, err)
	}

	_, otherKey := env.Tenant(t, "other")
	other, _ := client.New(url, client.WithAPIKey(otherKey))
	if l, err := client.Call(ctx, other, metal.JoinRequestsList, metal.ListJoinRequests{}); err != nil || len(l.Items) != 0 {
		t.Errorf("another tenant lists %+v, %v", l.Items, err)
	}
	bmc := metal.BMCInput{Driver: "ipmi", Address: "10.0.0.42:623", Username: "admin", Password: "pw"}
	if _, err := client.Call(ctx, other, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: first.ID, Name: "stolen", BMC: bmc}); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("another tenant approving: %v, want not_found", err)
	}

	mach, err := client.Call(ctx, cl, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: first.ID, Name: "fra1-r3-u12", BMC: bmc})
	if err != nil || mach.Facts.Serial != "SN-0042" || mach.Facts.MemoryGiB != 1024 || !mach.BMC.PasswordSet || mach.Site == "" ||
		len(mach.MACs) != 1 || mach.MACs[0] != "52:54:00:12:34:56" || mach.Profile != "pxe-ipmi" || mach.State != metal.StateAvailable {
		t.Fatalf("approve = %+v, %v; want the machine at the site, booting from its MAC, with the default profile", mach, err)
	}
	if _, err := client.Call(ctx, cl, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: first.ID, Name: "twice", BMC: bmc}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Errorf("approving twice: %v, want failed_precondition", err)
	}
	if n := computetest.Count(t, env.DB.Pool, `SELECT count(*) FROM compute.metal_machines WHERE name <> 'racked'`); n != 1 {
		t.Errorf("%d machines after a refused second approval, want 1: nothing half-written", n)
	}

	// A machine registered by its BMC alone, powered on, whose ramdisk asked to join: the
	// request is approved as that machine.
	if _, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "racked", BMC: bmc}); err != nil {
		t.Fatal(err)
	}
	third, err := submit(metal.Facts{Serial: "SN-0044", MACs: []string{"52:54:00:12:34:58"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, cl, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: third.ID, Machine: "racked", Name: "racked"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("approving as a machine and a new name at once: %v, want invalid_argument", err)
	}
	racked, err := client.Call(ctx, cl, metal.JoinRequestsApprove, metal.ApproveJoinRequest{Request: third.ID, Machine: "racked"})
	if err != nil || racked.Name != "racked" || racked.Facts.Serial != "SN-0044" || !slices.Equal(racked.MACs, []string{"52:54:00:12:34:58"}) || racked.Site != mach.Site {
		t.Fatalf("approve as an existing machine = %+v, %v", racked, err)
	}

	second, err := submit(metal.Facts{Serial: "SN-0043", MACs: []string{"52:54:00:12:34:57"}})
	if err != nil {
		t.Fatal(err)
	}
	rej, err := client.Call(ctx, cl, metal.JoinRequestsReject, metal.RejectJoinRequest{Request: second.ID, Reason: "not ours"})
	if err != nil || rej.State != "rejected" || rej.Reason != "not ours" || rej.DecidedBy == "" {
		t.Fatalf("reject = %+v, %v", rej, err)
	}
	// A rejected machine that boots again asks anew.
	if again, err := submit(metal.Facts{Serial: "SN-0043", MACs: []string{"52:54:00:12:34:57"}}); err != nil || again.ID == second.ID || again.State != "pending" {
		t.Errorf("after a rejection the machine asks again: %+v, %v", again, err)
	}
}
