package fleetconfig_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// TestApplyRefusesEndpointsAtRefusedAddresses is the regression test of fleet.apply accepting a
// webhook at 127.1 and its kin (issue 29, item 4): each spelling fails the apply naming the
// endpoint's url in the document, and nothing is written.
func TestApplyRefusesEndpointsAtRefusedAddresses(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} }})
	ctx := context.Background()
	for _, h := range []string{"127.1", "0x7f000001", "2130706433", "017700000001", "0", "127.000.000.001", "192.0.2.1", "[0000:0000::0002]", "[64:ff9b::a9fe:a9fe]"} {
		doc := "apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [webhooks]\n  webhooks:\n  - url: https://" + h + "/hook\n"
		p, err := env.Compute.API.Fleet.Plan(ctx, env.RootKey, api.PlanFleet{Document: doc})
		if err != nil {
			t.Fatalf("plan %s: %v", h, err)
		}
		_, err = env.Compute.API.Fleet.Apply(ctx, env.RootKey, api.ApplyFleet{Document: doc, Fingerprint: p.Fingerprint})
		if code, d := codeOf(err); code != api.CodeInvalidArgument || d["field"] != "spec.webhooks[0].url" {
			t.Errorf("apply with an endpoint at %s = %v (%v), want invalid_argument naming spec.webhooks[0].url", h, err, d)
		}
	}
	if x := export(t, env); strings.Contains(x.Document, "/hook") {
		t.Fatalf("refused endpoints were written:\n%s", x.Document)
	}
}
