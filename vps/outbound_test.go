package vps_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps"
)

// TestImageURLsAreCheckedByTheOutboundPolicy: a VM host fetches an image's files for the
// tenant, so under the default outbound policy a URL at a refused address, in any spelling, is
// refused naming its field, and nothing is registered.
func TestImageURLsAreCheckedByTheOutboundPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, err := vps.New(vps.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: []compute.Module{m}, Configure: func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} }})
	sum := strings.Repeat("a", 64)
	for _, h := range []string{"127.1", "0x7f000001", "2130706433", "017700000001", "0", "127.000.000.001", "localhost", "169.254.169.254",
		"[0000:0000::0002]", "[::ffff:a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]", "[2002:a9fe:a9fe::]", "[fec0::1]", "10.1", "192.0.2.1"} {
		u := "http://" + h + "/file"
		for field, in := range map[string]vps.RegisterVMImage{
			"kernel.url": {Name: "k", Kernel: &vps.Artifact{URL: u, SHA256: sum}},
			"initrd.url": {Name: "i", Kernel: &vps.Artifact{URL: "https://images.example.com/vmlinuz", SHA256: sum}, Initrd: &vps.Artifact{URL: u, SHA256: sum}},
			"disk.url":   {Name: "d", Disk: &vps.Artifact{URL: u, SHA256: sum}},
		} {
			_, err := compute.Invoke(ctx, env.Compute, env.RootKey, vps.VMImagesRegister, in)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument || ae.Details["field"] != field {
				t.Errorf("an image whose %s is %s: %v, want invalid_argument naming %s", field, u, err, field)
			}
		}
	}
	if _, err := compute.Invoke(ctx, env.Compute, env.RootKey, vps.VMImagesRegister, vps.RegisterVMImage{Name: "public",
		Disk: &vps.Artifact{URL: "https://images.example.com/disk.qcow2", SHA256: sum}}); err != nil {
		t.Errorf("an image at a public URL: %v", err)
	}
}
