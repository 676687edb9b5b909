package proxmox_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/provider"
	"github.com/better-compute/compute/vps/provider/internal/recorded"
	"github.com/better-compute/compute/vps/provider/proxmox"
)

// The contract tests replay exchanges recorded from Proxmox VE's API documentation (the API
// viewer; testdata/*.json, each naming what it shows): the server checks every request the
// client sends against the recorded one, and answers as the documentation says Proxmox VE
// does. No real Proxmox VE cluster is used.

const (
	token = "root@pam!bc=0b3f6c2e-5d7a-4a39-9f51-2b1f0c8d9e77"
	key   = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINNFpfptrSPFFla0BZdtqfDWQ48ZfWyrkOd1xnInGWod ops@example.com"
	inst  = "0191e8a4-1111-7000-8000-000000000001"
)

// loopback is the outbound policy of the tests: the recorded server listens on loopback.
var loopback, _ = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})

func account(s *recorded.Server, opts map[string]string) provider.Account {
	return provider.Account{Endpoint: s.URL + "/api2/json", Token: token, Options: opts, Outbound: loopback}
}

// TestCheckFindsTheNode: the token lists the nodes and the account's node is among them; a
// node not in the cluster is ErrInvalid naming those that are; a refused token is
// ErrUnauthorized; a token not of Proxmox's form and a missing node are refused before any
// request.
func TestCheckFindsTheNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := proxmox.New()
	if err := p.Check(ctx, account(recorded.Serve(t, "testdata/check.json"), map[string]string{"node": "pve2"})); err != nil {
		t.Fatalf("a valid account: %v", err)
	}
	err := p.Check(ctx, account(recorded.Serve(t, "testdata/check.json"), map[string]string{"node": "pve9"}))
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "pve1, pve2") {
		t.Errorf("an unknown node: %v", err)
	}
	err = p.Check(ctx, account(recorded.Serve(t, "testdata/check_unauthorized.json"), map[string]string{"node": "pve1"}))
	// What Proxmox answered is the operator's alone: the tenant reads its status.
	if !errors.Is(err, provider.ErrUnauthorized) || !strings.Contains(err.Error(), "HTTP 401") || strings.Contains(err.Error(), "authentication failure") ||
		!strings.Contains(netpolicy.Detail(err), "authentication failure") {
		t.Errorf("a refused token: %v (detail %s)", err, netpolicy.Detail(err))
	}
	// The outbound policy decides where the client connects: by default, not to loopback.
	var refused *netpolicy.RefusedError
	never := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a refused address was reached") }))
	defer never.Close()
	if err := p.Check(ctx, provider.Account{Endpoint: never.URL + "/api2/json", Token: token, Options: map[string]string{"node": "pve2"}}); !errors.As(err, &refused) {
		t.Errorf("the default policy and an endpoint on loopback: %v, want refused", err)
	}
	for _, a := range []provider.Account{
		{Endpoint: "http://127.0.0.1:1/api2/json", Token: "just-a-secret", Options: map[string]string{"node": "pve1"}},
		{Endpoint: "http://127.0.0.1:1/api2/json", Token: token},
	} {
		if err := p.Check(ctx, a); err == nil {
			t.Errorf("%+v was accepted", a.Options)
		}
	}
	if err := p.Check(ctx, provider.Account{Endpoint: "https://127.0.0.1:1/api2/json", Token: token,
		Options: map[string]string{"node": "pve1", "caPEM": "not a certificate"}}); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("a caPEM without a certificate: %v", err)
	}
}

// TestCreateClonesSizesAndStarts: the template is found by name, the next VMID cloned to the
// account's node on its storage, configured (cores, memory, the tag, the labels, the keys in
// Proxmox's encoding, cloud-init's user and DHCP), its disk grown, started, each task awaited.
func TestCreateClonesSizesAndStarts(t *testing.T) {
	t.Parallel()
	s := recorded.Serve(t, "testdata/create.json")
	got, err := proxmox.New().Create(context.Background(), account(s, map[string]string{"node": "pve2", "storage": "local-lvm", "ciuser": "debian"}),
		provider.Spec{Name: "bc-" + inst, Image: "debian-12-cloud", VCPUs: 2, MemoryMiB: 4096, DiskGiB: 40, SSHKeys: []string{key},
			Labels: map[string]string{"better-compute/instance": inst}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(provider.Server{ID: "pve2/105/bc-" + inst, Name: "bc-" + inst, Status: provider.StatusRunning}, got); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
}

// TestCreateRefusesATakenNameAndCleansUp: a VM of the name is ErrExists and nothing is cloned;
// a clone whose configuration fails is destroyed, and the failure (a lock timeout, worth a
// retry) is returned as none of the contract's errors; user data and an unknown template are
// ErrInvalid.
func TestCreateRefusesATakenNameAndCleansUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := proxmox.New()
	spec := provider.Spec{Name: "bc-" + inst, Image: "9000"}
	_, err := p.Create(ctx, account(recorded.Serve(t, "testdata/create_exists.json"), map[string]string{"node": "pve1"}), spec)
	if !errors.Is(err, provider.ErrExists) {
		t.Errorf("a taken name: %v", err)
	}
	s := recorded.Serve(t, "testdata/create_cleanup.json")
	_, err = p.Create(ctx, account(s, map[string]string{"node": "pve1"}), spec)
	if err == nil || errors.Is(err, provider.ErrInvalid) || errors.Is(err, provider.ErrExists) || !strings.Contains(netpolicy.Detail(err), "got timeout") ||
		strings.Contains(err.Error(), "removing the clone") {
		t.Errorf("a failed configuration: %v, want the lock timeout and a clean removal", err)
	}
	spec.UserData = "#cloud-config\n"
	if _, err := p.Create(ctx, provider.Account{Endpoint: "http://127.0.0.1:1/api2/json", Token: token}, spec); !errors.Is(err, provider.ErrInvalid) ||
		!strings.Contains(err.Error(), "SSH keys") {
		t.Errorf("user data: %v", err)
	}
	_, err = p.Create(ctx, account(recorded.Serve(t, "testdata/list.json"), map[string]string{"node": "pve1"}), provider.Spec{Name: "bc-new", Image: "arch"})
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), `"arch"`) {
		t.Errorf("an unknown template: %v", err)
	}
}

// TestDeleteStopsDestroysAndLeavesOthersAlone: a running VM of ours is stopped and destroyed
// with its disks; one gone is done, and so is one whose VMID now holds a VM of another name;
// one without the tag is refused untouched (the recordings have no stop or destroy for them);
// an id not node/vmid/name is refused.
func TestDeleteStopsDestroysAndLeavesOthersAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := proxmox.New()
	s := recorded.Serve(t, "testdata/delete.json")
	for range 2 {
		if err := p.Delete(ctx, account(s, nil), "pve2/105/bc-"+inst); err != nil {
			t.Fatal(err)
		}
	}
	err := p.Delete(ctx, account(recorded.Serve(t, "testdata/delete_foreign.json"), nil), "pve1/100/db")
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "not tagged") {
		t.Errorf("a VM not ours: %v", err)
	}
	for _, id := range []string{"4711", "pve2/105"} {
		if err := p.Delete(ctx, account(s, nil), id); !errors.Is(err, provider.ErrInvalid) {
			t.Errorf("a foreign id %q: %v", id, err)
		}
	}
	// A VMID that holds another VM now (its VM destroyed, the number reused) is not touched.
	if err := p.Delete(ctx, account(recorded.Serve(t, "testdata/delete_reused.json"), nil), "pve2/105/bc-"+inst); err != nil {
		t.Errorf("a reused VMID: %v", err)
	}
}

// TestReinstallClonesAgainUnderTheSameVMID: the VM is destroyed and the template cloned under
// its VMID and name, with its cores, memory, keys, tag, NIC (its MAC) and disk size, and
// started.
func TestReinstallClonesAgainUnderTheSameVMID(t *testing.T) {
	t.Parallel()
	s := recorded.Serve(t, "testdata/reinstall.json")
	if err := proxmox.New().Reinstall(context.Background(), account(s, nil), "pve2/105/bc-"+inst, "debian-12-cloud"); err != nil {
		t.Fatal(err)
	}
}

// TestListKeepsTaggedVMsOfThePrefix: templates, containers, VMs without the tag and names
// outside the prefix are left out.
func TestListKeepsTaggedVMsOfThePrefix(t *testing.T) {
	t.Parallel()
	got, err := proxmox.New().List(context.Background(), account(recorded.Serve(t, "testdata/list.json"), nil), "bc-")
	if err != nil {
		t.Fatal(err)
	}
	want := []provider.Server{
		{ID: "pve2/105/bc-" + inst, Name: "bc-" + inst, Status: provider.StatusRunning},
		{ID: "pve2/106/bc-0191e8a4-1111-7000-8000-000000000002", Name: "bc-0191e8a4-1111-7000-8000-000000000002", Status: provider.StatusStopped},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("listed (-want +got):\n%s", diff)
	}
}
