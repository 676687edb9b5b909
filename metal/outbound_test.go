package metal_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal"
)

// TestBMCsTheControlPlaneDialsAreCheckedByTheOutboundPolicy: under the default outbound policy
// the BMC of a machine with no site, which the control plane dials itself, is refused at a
// loopback, link-local, private or documentation address in any spelling, naming bmc.address,
// at creation and when it is set; a machine of a site keeps its private BMC (its site's agent
// dials it); an image's URL at such an address is refused too.
func TestBMCsTheControlPlaneDialsAreCheckedByTheOutboundPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}, Configure: func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} }})
	cl, err := client.New(env.Server(t), client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error, field string) {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || ae.Details["field"] != field || ae.Details["reason"] != "refused_by_outbound_policy" {
			t.Errorf("%s: %v, want invalid_argument naming %s", what, err, field)
		}
	}
	for _, h := range []string{"127.0.0.1", "127.1", "0x7f000001", "2130706433", "017700000001", "0", "127.000.000.001", "localhost", "[::1]",
		"[0000:0000::0002]", "169.254.169.254", "0xa9fea9fe", "10.1", "192.168.1.20", "192.0.2.5", "[fec0::1]", "[64:ff9b::a00:1]"} {
		for _, b := range []metal.BMCInput{
			{Driver: "ipmi", Address: h + ":623", Username: "admin", Password: "pw"},
			{Driver: "redfish", Address: "https://" + h, Username: "admin", Password: "pw"},
		} {
			_, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "m-" + strings.NewReplacer(".", "-", ":", "-", "[", "", "]", "").Replace(h), BMC: b})
			refused(b.Driver+" BMC at "+b.Address, err, "bmc.address")
		}
		_, err := client.Call(ctx, cl, metal.ImagesRegister, metal.RegisterImage{Name: "img", URL: "http://" + h + "/disk.raw", Format: "raw", SizeBytes: 1, SHA256: strings.Repeat("ab", 32)})
		refused("an image at "+h, err, "url")
	}
	// A public BMC is accepted; moved to a refused address it is refused, and keeps its old one.
	pub := metal.BMCInput{Driver: "ipmi", Address: "198.51.99.1:623", Username: "admin", Password: "pw"}
	mach, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "public", BMC: pub})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Call(ctx, cl, metal.MachinesSetBMC, metal.SetMachineBMC{Machine: mach.ID, BMC: metal.BMCInput{Driver: "ipmi", Address: "127.1:623", Username: "admin", Password: "pw"}})
	refused("a BMC moved to 127.1", err, "bmc.address")
	if got, _ := client.Call(ctx, cl, metal.MachinesGet, metal.MachineRef{Machine: mach.ID}); got.BMC.Address != pub.Address {
		t.Errorf("after a refused change the BMC is at %s", got.BMC.Address)
	}
	// A machine of a site: its site's agent dials the BMC, on the site's network.
	if _, err := env.Compute.API.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "fra1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "racked", Site: "fra1",
		BMC: metal.BMCInput{Driver: "ipmi", Address: "10.0.0.5:623", Username: "admin", Password: "pw"}}); err != nil {
		t.Errorf("a private BMC of a machine of a site: %v", err)
	}
}

// TestBMCErrorsTellTheTenantNoBody: a Redfish BMC the control plane dials that answers with an
// error fails the power run with the answer's status; its body, which could be any internal
// service's, is not in workflows.get.
func TestBMCErrorsTellTheTenantNoBody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const body = `{"error":{"code":"Base.1.0.GeneralError","message":"internal-secret: vault token s.abc123"}}`
	bmc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(body))
	}))
	defer bmc.Close()
	m, err := metal.New(metal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}}) // loopback allowed
	cl, err := client.New(env.Server(t), client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	mach, err := client.Call(ctx, cl, metal.MachinesCreate, metal.CreateMachine{Name: "rf", BMC: metal.BMCInput{Driver: "redfish", Address: bmc.URL, Username: "admin", Password: "pw"}})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := client.Call(ctx, cl, metal.MachinesPower, metal.PowerMachine{Machine: mach.ID, Action: "on"})
	if err != nil {
		t.Fatal(err)
	}
	var run api.WorkflowRun
	computetest.Eventually(t, 60*time.Second, "the power workflow ends", func() bool {
		if run, err = cl.Workflows.Get(ctx, api.GetWorkflow{Run: pr.Run}); err != nil {
			t.Fatal(err)
		}
		return run.State != api.WorkflowRunning
	})
	text := run.Error
	for _, s := range run.Steps {
		text += " " + s.Error
	}
	if run.State != api.WorkflowFailed || !strings.Contains(text, "HTTP 401") || strings.Contains(text, "internal-secret") || strings.Contains(text, "GeneralError") {
		t.Errorf("the run is %s saying %q: want failed with the BMC's status, without its body", run.State, text)
	}
}
