package vps_test

import (
	"testing"

	"github.com/better-compute/compute/vps/hostapi"
)

// TestTheHostIsToldWhoseImageAnInstanceBoots: a VM host keeps what each tenant fetched apart (a
// tenant boots cached bytes only once it fetched them itself: vps/hostagent), so the desired
// state names the tenant of the image each instance boots.
func TestTheHostIsToldWhoseImageAnInstanceBoots(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	one, err := f.create("one", "cpu16") // on the VM host: it requires the label only that host has
	if err != nil {
		t.Fatal(err)
	}
	got := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 })
	if in := got.Instances[0]; in.ID != one.ID || in.Tenant == "" || in.Tenant != one.TenantID {
		t.Fatalf("the desired instance names the tenant %q; want %q, its image's", in.Tenant, one.TenantID)
	}
}
