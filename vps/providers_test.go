package vps_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/provision"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/provider"
	"github.com/better-compute/compute/vps/provider/hetzner"
	"github.com/better-compute/compute/vps/provider/hetzner/hetznerfake"
	"github.com/better-compute/compute/vps/provider/proxmox"
	"github.com/better-compute/compute/vps/provider/proxmox/proxmoxfake"
)

// Provider pools are tested against hetznerfake, a local server that answers as Hetzner
// Cloud's documented API does (no real account is used), on a real database, with the module's
// River jobs and reconciler running, over real HTTP.

const (
	hzToken = "hz-Secret-Token-0123456789abcdef"
	sshKey  = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINNFpfptrSPFFla0BZdtqfDWQ48ZfWyrkOd1xnInGWod ops@example.com"
	// userData is write-only too.
	userData = "#cloud-config\nwrite_files: [{path: /etc/motd, content: 'user-data-Secret-42'}]\n"
)

type providerEnv struct {
	env *computetest.Env
	url string
	cl  *client.Client
	hz  *hetznerfake.API
}

func startProviders(t *testing.T) providerEnv { return startProvidersWith(t, nil) }

// startProvidersWith is startProviders with the compute options changed by configure.
func startProvidersWith(t *testing.T, configure func(*compute.Options)) providerEnv {
	t.Helper()
	return startProviderEnv(t, vps.Options{}, nil, configure)
}

// startProviderEnv is startProviders with vps's options (their reconcile period set here), other
// modules beside vps, and the compute options changed by configure.
func startProviderEnv(t *testing.T, opts vps.Options, others []compute.Module, configure func(*compute.Options)) providerEnv {
	t.Helper()
	opts.ProviderReconcileEvery = 200 * time.Millisecond
	m, err := vps.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	env := computetest.New(t, computetest.Options{Modules: append([]compute.Module{m}, others...), Configure: configure})
	url := env.Server(t)
	if err := env.Compute.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(context.Background(), cl, vps.FlavorsCreate, vps.CreateFlavor{Name: "small", VCPUs: 2, MemoryGiB: 4, DiskGiB: 40}); err != nil {
		t.Fatal(err)
	}
	return providerEnv{env: env, url: url, cl: cl, hz: hetznerfake.Start(t, hzToken)}
}

// waitInstance polls the instance until ok, or fails the test after 30 s.
func (e providerEnv) waitInstance(t *testing.T, id string, what string, ok func(vps.ProviderInstance) bool) vps.ProviderInstance {
	t.Helper()
	var i vps.ProviderInstance
	var err error
	done := false
	defer func() { // what it was, when the wait failed
		if !done {
			t.Logf("instance %s: %+v, %v", id, i, err)
		}
	}()
	computetest.Eventually(t, 30*time.Second, "instance "+id+" becomes "+what, func() bool {
		i, err = client.Call(context.Background(), e.cl, vps.ProviderInstancesGet, vps.ProviderInstanceRef{Instance: id})
		return err == nil && ok(i)
	})
	done = true
	return i
}

// job is the state River has the job of kind for instance in ("" while there is none), and
// how many times it was worked.
func (e providerEnv) job(t *testing.T, kind, instance string) (state string, attempts int) {
	t.Helper()
	err := e.env.DB.Pool.QueryRow(context.Background(), `SELECT state::text, attempt FROM compute.river_job WHERE kind = $1 AND args->>'instance' = $2
		ORDER BY id DESC LIMIT 1`, kind, instance).Scan(&state, &attempts)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return state, attempts
}

func (e providerEnv) events(t *testing.T, typ, subject string) []api.Event {
	t.Helper()
	p, err := client.Call(context.Background(), e.cl, api.EventsList, api.ListEvents{Type: typ, Subject: subject, PageRequest: api.PageRequest{Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	return p.Items
}

// post sends a raw call and returns the answer's body, for checking what it holds.
func (e providerEnv) post(t *testing.T, path, body string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.url+"/api/compute/"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.env.RootKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s answered %d %s", path, resp.StatusCode, b)
	}
	return b
}

func apiErr(err error) *api.Error {
	var e *api.Error
	if errors.As(err, &e) {
		return e
	}
	return &api.Error{}
}

// TestProviderInstancesLiveAtTheProvider runs an instance's life at a (fake) Hetzner: a
// refused token is a clear error and stores nothing; the account's token is checked, sealed and
// never answered; an instance's server is made by its job (type from the account's flavor map,
// image, location, the SSH key added to the project, the user data, the instance's label),
// reported running by the reconciler; the account's limit holds; a deletion deletes the server;
// a server deleted at the provider makes its instance lost; a server with our mark and no
// instance is reported once; the account goes only when no server of it may remain.
func TestProviderInstancesLiveAtTheProvider(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startProviders(t)
	cl := e.cl

	// A refused token: invalid_argument naming the token, with the provider's status (the
	// endpoint is the tenant's choice: what it answered is never repeated); nothing stored.
	_, err := client.Call(ctx, cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name, Endpoint: e.hz.Endpoint(), Token: "revoked-token"})
	if ae := apiErr(err); ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "token" || ae.Details["reason"] != "token_refused" ||
		!strings.Contains(ae.Message, "HTTP 401") || strings.Contains(ae.Message, "unable to authenticate") {
		t.Fatalf("a refused token: %v", err)
	}
	for _, c := range []struct {
		in    vps.CreateProviderAccount
		field string
	}{
		{vps.CreateProviderAccount{Name: "x", Kind: "linode", Token: "t"}, "kind"},
		{vps.CreateProviderAccount{Name: "x", Kind: hetzner.Name, Token: "a b"}, "token"},
		{vps.CreateProviderAccount{Name: "x", Kind: hetzner.Name, Token: "t", Endpoint: "ftp://x"}, "endpoint"},
		{vps.CreateProviderAccount{Name: "x", Kind: hetzner.Name, Token: "t", Flavors: map[string]string{"small": ""}}, "flavors.small"},
	} {
		_, err := client.Call(ctx, cl, vps.ProviderAccountsCreate, c.in)
		if ae := apiErr(err); ae.Code != api.CodeInvalidArgument || ae.Details["field"] != c.field {
			t.Errorf("%+v: %v, want invalid %s", c.in, err, c.field)
		}
	}
	if p, err := client.Call(ctx, cl, vps.ProviderAccountsList, vps.ListProviderAccounts{}); err != nil || len(p.Items) != 0 {
		t.Fatalf("after refusals the accounts are %+v, %v", p.Items, err)
	}

	acct, err := client.Call(ctx, cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name, Endpoint: e.hz.Endpoint(),
		Token: hzToken, Flavors: map[string]string{"small": "cx22"}, Location: "fsn1", MaxInstances: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !acct.TokenSet || acct.Kind != hetzner.Name || acct.Flavors["small"] != "cx22" {
		t.Errorf("account %+v", acct)
	}

	// An instance: pending at once, then its server exists at the provider, then running.
	in := vps.CreateProviderInstance{Name: "web-1", Provider: "hz", Flavor: "small", Image: "ubuntu-24.04", SSHKeys: []string{sshKey},
		UserData: userData, Labels: map[string]string{"team": "web"}}
	web1, err := client.Call(ctx, cl, vps.ProviderInstancesCreate, in)
	if err != nil {
		t.Fatal(err)
	}
	if web1.Status != vps.ProviderPending || web1.ServerName != "bc-"+web1.ID || !web1.UserDataSet || web1.Location != "fsn1" || web1.ServerType != "cx22" {
		t.Errorf("created %+v", web1)
	}
	web1 = e.waitInstance(t, web1.ID, "running", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderRunning })
	servers := e.hz.Servers()
	if len(servers) != 1 {
		t.Fatalf("the provider has %d servers, want 1: %+v", len(servers), servers)
	}
	s := servers[0]
	if strconv.FormatInt(s.ID, 10) != web1.ServerID || s.Name != "bc-"+web1.ID || s.Type != "cx22" || s.Image != "ubuntu-24.04" || s.Location != "fsn1" ||
		s.UserData != userData || len(s.SSHKeys) != 1 || s.Labels[vps.LabelInstance] != web1.ID || s.Labels[hetzner.ManagedLabel] != hetzner.ManagedValue {
		t.Errorf("the server at the provider is %+v for %+v", s, web1)
	}
	if web1.IPv4 != s.IPv4 || web1.IPv4 == "" {
		t.Errorf("the instance's IPv4 is %q, the server's %q", web1.IPv4, s.IPv4)
	}

	// Refusals at creation: a flavor the account does not map; a name taken; the limit.
	if _, err := client.Call(ctx, cl, vps.FlavorsCreate, vps.CreateFlavor{Name: "big", VCPUs: 16, MemoryGiB: 64}); err != nil {
		t.Fatal(err)
	}
	bad := in
	bad.Name, bad.Flavor = "web-9", "big"
	if _, err := client.Call(ctx, cl, vps.ProviderInstancesCreate, bad); apiErr(err).Details["reason"] != "flavor_not_mapped" {
		t.Errorf("an unmapped flavor: %v", err)
	}
	if _, err := client.Call(ctx, cl, vps.ProviderInstancesCreate, in); apiErr(err).Code != api.CodeConflict {
		t.Errorf("a taken name: %v", err)
	}
	in2 := in
	in2.Name, in2.UserData, in2.SSHKeys = "web-2", "", nil
	web2, err := client.Call(ctx, cl, vps.ProviderInstancesCreate, in2)
	if err != nil {
		t.Fatal(err)
	}
	in3 := in2
	in3.Name = "web-3"
	if _, err := client.Call(ctx, cl, vps.ProviderInstancesCreate, in3); apiErr(err).Code != api.CodeQuotaExceeded {
		t.Errorf("over the account's limit: %v", err)
	}

	// Deleting web-2 deletes its server (made or not yet made) and ends deleted.
	if d, err := client.Call(ctx, cl, vps.ProviderInstancesDelete, vps.ProviderInstanceRef{Instance: "web-2"}); err != nil || d.DeletedAt == nil {
		t.Fatalf("delete: %+v, %v", d, err)
	}
	e.waitInstance(t, web2.ID, "deleted", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderDeleted })
	computetest.Eventually(t, 10*time.Second, "web-2's server leaves the provider", func() bool { return len(e.hz.Servers()) == 1 })

	// A server deleted at the provider: its instance is lost, with an event saying so.
	e.hz.Remove(s.ID)
	lost := e.waitInstance(t, web1.ID, "lost", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderLost })
	if !strings.Contains(lost.StatusDetail, web1.ServerID) || !strings.Contains(lost.StatusDetail, "not deleted by this control plane") {
		t.Errorf("the lost instance says %q", lost.StatusDetail)
	}
	computetest.Eventually(t, 30*time.Second, "the lost event", func() bool {
		return slices.ContainsFunc(e.events(t, vps.EventInstanceStatus, web1.ID), func(ev api.Event) bool { return ev.Data["status"] == vps.ProviderLost })
	})

	// A server with our mark that no instance has: reported once, however many rounds see it.
	stray := e.hz.Add(hetznerfake.Server{Name: "bc-0191e8a4-1111-7000-8000-00000000beef", Type: "cx22",
		Labels: map[string]string{hetzner.ManagedLabel: hetzner.ManagedValue}})
	computetest.Eventually(t, 30*time.Second, "the stray server to be noticed", func() bool {
		p, err := client.Call(ctx, cl, vps.ProviderAccountsList, vps.ListProviderAccounts{})
		return err == nil && len(p.Items) == 1 && slices.Contains(p.Items[0].UnknownServers, strconv.FormatInt(stray, 10))
	})
	// Several more rounds see it: each lists the account's servers.
	rounds := countRequests(e.hz, "GET /v1/servers")
	computetest.Eventually(t, 30*time.Second, "three more rounds of the reconciler", func() bool { return countRequests(e.hz, "GET /v1/servers") >= rounds+3 })
	computetest.Eventually(t, 30*time.Second, "the unknown-server event", func() bool { return len(e.events(t, vps.EventProviderServerUnknown, acct.ID)) > 0 })
	if evs := e.events(t, vps.EventProviderServerUnknown, acct.ID); len(evs) != 1 || evs[0].Data["server"] != strconv.FormatInt(stray, 10) {
		t.Errorf("unknown-server events: %+v, want one for %d", evs, stray)
	}

	// Neither the token nor the user data is in any answer; both are stored sealed.
	for _, call := range []struct{ path, body string }{
		{"providerAccounts/list", `{}`},
		{"providerInstances/list", `{"deleted":true}`},
		{"providerInstances/get", `{"instance":"` + web1.ID + `"}`},
		{"events/list", `{"limit":500}`},
	} {
		if b := e.post(t, call.path, call.body); bytes.Contains(b, []byte(hzToken)) || bytes.Contains(b, []byte("user-data-Secret-42")) {
			t.Errorf("%s answered a secret: %s", call.path, b)
		}
	}
	var token, ud []byte
	if err := e.env.DB.Pool.QueryRow(ctx, `SELECT a.token, i.user_data FROM compute.vps_provider_accounts a JOIN compute.vps_provider_instances i ON i.account_id = a.id
		WHERE i.id = $1`, web1.ID).Scan(&token, &ud); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(token, []byte(hzToken)) || bytes.Contains(ud, []byte("user-data-Secret-42")) || len(token) == 0 || len(ud) == 0 {
		t.Error("the token or the user data is stored in the clear")
	}

	// The account stays while web-1 (lost, not deleted) may have a server; deleting web-1 (its
	// server gone already) ends it, and then the account goes.
	if _, err := client.Call(ctx, cl, vps.ProviderAccountsDelete, vps.ProviderAccountRef{Account: "hz"}); apiErr(err).Details["reason"] != "in_use" {
		t.Errorf("deleting an account in use: %v", err)
	}
	if _, err := client.Call(ctx, cl, vps.ProviderInstancesDelete, vps.ProviderInstanceRef{Instance: web1.ID}); err != nil {
		t.Fatal(err)
	}
	e.waitInstance(t, web1.ID, "deleted", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderDeleted })
	if _, err := client.Call(ctx, cl, vps.ProviderAccountsDelete, vps.ProviderAccountRef{Account: "hz"}); err != nil {
		t.Fatalf("deleting the account: %v", err)
	}
	gone, err := client.Call(ctx, cl, vps.ProviderInstancesGet, vps.ProviderInstanceRef{Instance: web1.ID})
	if err != nil || gone.Provider != "hz" || gone.ProviderID != "" {
		t.Errorf("after its account went the instance reads %+v, %v", gone, err)
	}
}

// TestProviderJobsRetryAndGiveUpOnRefusals: a provider's 503s are retried by the create job
// until the server is made; a refusal (here: no server type, as an account without a flavor
// map gives Hetzner) puts the instance in error at once, saying why, and is not retried; a
// server made while its instance was being deleted is deleted.
// TestProviderOfAnotherModule: a provider that another module registers as a provision driver
// (kind vps.DriverKindProvider) is one vps uses as its own: accounts of its kind are checked with
// it and their instances made by it, and an unknown kind's refusal lists what is registered.
// vps itself registers none here.
func TestProviderOfAnotherModule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startProviderEnv(t, vps.Options{Providers: []provider.Provider{}}, []compute.Module{cloudModule{hetzner.New()}}, nil)
	_, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "x", Kind: proxmox.Name, Token: "t"})
	if ae := apiErr(err); ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "kind" || !strings.HasSuffix(ae.Message, "(hetzner)") {
		t.Fatalf("an account of a kind no module registered: %v", err)
	}
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name, Endpoint: e.hz.Endpoint(),
		Token: "revoked-token"}); apiErr(err).Details["reason"] != "token_refused" {
		t.Fatalf("the other module's provider did not check the token: %v", err)
	}
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name, Endpoint: e.hz.Endpoint(),
		Token: hzToken, Flavors: map[string]string{"small": "cx22"}, Location: "fsn1"}); err != nil {
		t.Fatal(err)
	}
	in, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "web-1", Provider: "hz", Flavor: "small", Image: "ubuntu-24.04"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitInstance(t, in.ID, "running", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderRunning })
	if servers := e.hz.Servers(); len(servers) != 1 {
		t.Fatalf("the provider has %d servers, want 1: %+v", len(servers), servers)
	}
}

// cloudModule is a host's own module that brings a provider.
type cloudModule struct{ p provider.Provider }

func (cloudModule) Name() string { return "hostcloud" }

func (m cloudModule) Register(r *modules.Registry) error {
	r.Driver(provision.Driver{Kind: vps.DriverKindProvider, Name: m.p.Name(), Value: m.p})
	return nil
}

func TestProviderJobsRetryAndGiveUpOnRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startProviders(t)
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name,
		Endpoint: e.hz.Endpoint(), Token: hzToken, Flavors: map[string]string{"small": "cx22"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz-unmapped", Kind: hetzner.Name,
		Endpoint: e.hz.Endpoint(), Token: hzToken}); err != nil {
		t.Fatal(err)
	}

	e.hz.FailCreates(2)
	i, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "retry", Provider: "hz", Flavor: "small", Image: "debian-12"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitInstance(t, i.ID, "made", func(i vps.ProviderInstance) bool { return i.ServerID != "" })
	if n := countRequests(e.hz, "POST /v1/servers"); n != 3 {
		t.Errorf("the provider was asked %d times, want 3 (two 503s, then made)", n)
	}

	posts := countRequests(e.hz, "POST /v1/servers")
	refused, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "refused", Provider: "hz-unmapped", Flavor: "small", Image: "debian-12"})
	if err != nil {
		t.Fatal(err)
	}
	refused = e.waitInstance(t, refused.ID, "error", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderError })
	if !strings.Contains(refused.StatusDetail, "server type") {
		t.Errorf("the refused instance says %q", refused.StatusDetail)
	}
	// Its job ends for good after its one attempt: River never runs it again.
	computetest.Eventually(t, 30*time.Second, "the refused instance's create job ends", func() bool {
		st, attempts := e.job(t, "vps.provider.create", refused.ID)
		if attempts > 1 || st == "retryable" {
			t.Fatalf("a refusal was retried: its job is %s after %d attempts", st, attempts)
		}
		return st == "cancelled" || st == "completed" || st == "discarded"
	})
	if n := countRequests(e.hz, "POST /v1/servers"); n != posts {
		t.Errorf("a refusal was retried: %d creations asked, want %d", n, posts)
	}
	if got, _ := client.Call(ctx, e.cl, vps.ProviderInstancesGet, vps.ProviderInstanceRef{Instance: refused.ID}); got.Status != vps.ProviderError {
		t.Errorf("the refused instance became %+v", got)
	}

	// Deleted at once, before or while its job makes the server: no server remains.
	quick, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "quick", Provider: "hz", Flavor: "small", Image: "debian-12"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Call(ctx, e.cl, vps.ProviderInstancesDelete, vps.ProviderInstanceRef{Instance: quick.ID}); err != nil {
		t.Fatal(err)
	}
	e.waitInstance(t, quick.ID, "deleted", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderDeleted })
	computetest.Eventually(t, 30*time.Second, "no server of the quick instance", func() bool {
		return !slices.ContainsFunc(e.hz.Servers(), func(s hetznerfake.Server) bool { return s.Name == "bc-"+quick.ID })
	})

	// Reinstall rebuilds the server with the new image.
	if _, err := client.Call(ctx, e.cl, vps.ProviderInstancesReinstall, vps.ReinstallProviderInstance{Instance: "retry", Image: "ubuntu-24.04"}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, "the rebuild", func() bool {
		return slices.ContainsFunc(e.hz.Servers(), func(s hetznerfake.Server) bool { return s.Name == "bc-"+i.ID && s.Image == "ubuntu-24.04" })
	})
	if _, err := client.Call(ctx, e.cl, vps.ProviderInstancesReinstall, vps.ReinstallProviderInstance{Instance: refused.ID}); apiErr(err).Details["reason"] != "no_server" {
		t.Errorf("reinstalling an instance without a server: %v", err)
	}
}

func countRequests(hz *hetznerfake.API, what string) int {
	n := 0
	for _, r := range hz.Requests() {
		if r == what {
			n++
		}
	}
	return n
}

// TestProviderInstancesAtProxmox runs instances through the proxmox provider against
// proxmoxfake (a local server answering as Proxmox VE's documented API does; no real cluster is
// used): an account whose node is not in the cluster is refused; an instance is a clone of the
// template on the account's node, sized by its flavor, with the SSH key, tagged and running;
// user data is refused with the reason; a VM destroyed behind our back makes its instance lost,
// and deleting that instance leaves alone the VM that took its VMID since; deleting an instance
// destroys its VM.
func TestProviderInstancesAtProxmox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startProviders(t)
	const pxToken = "root@pam!bc=6f1c0d2e-Secret"
	px := proxmoxfake.Start(t, pxToken, "debian-12-cloud", "pve1", "pve2")
	acct := vps.CreateProviderAccount{Name: "pve", Kind: proxmox.Name, Endpoint: px.Endpoint(), Token: pxToken, Options: map[string]string{"node": "pve9"}}
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, acct); apiErr(err).Details["reason"] != "account_refused" || !strings.Contains(err.Error(), "pve1, pve2") {
		t.Errorf("a node not in the cluster: %v", err)
	}
	acct.Options = map[string]string{"node": "pve2", "ciuser": "debian"}
	if _, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, acct); err != nil {
		t.Fatal(err)
	}

	db1, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "db-1", Provider: "pve", Flavor: "small",
		Image: "debian-12-cloud", SSHKeys: []string{sshKey}})
	if err != nil {
		t.Fatal(err)
	}
	db1 = e.waitInstance(t, db1.ID, "running", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderRunning })
	vms := px.VMs()
	if len(vms) != 1 {
		t.Fatalf("the cluster has %d VMs, want 1: %+v", len(vms), vms)
	}
	v := vms[0]
	if db1.ServerID != fmt.Sprintf("pve2/%d/bc-%s", v.VMID, db1.ID) || v.Node != "pve2" || v.Name != "bc-"+db1.ID || v.Status != "running" ||
		v.Config["cores"] != float64(2) || v.Config["memory"] != float64(4096) || v.Config["tags"] != "better-compute" || v.Config["ciuser"] != "debian" ||
		!strings.Contains(fmt.Sprint(v.Config["sshkeys"]), "ssh-ed25519%20AAAA") || v.Config["scsi0"] != fmt.Sprintf("local-lvm:vm-%d-disk-0,size=40G", v.VMID) ||
		!strings.Contains(fmt.Sprint(v.Config["description"]), vps.LabelInstance+"="+db1.ID) {
		t.Errorf("the VM is %+v for %+v", v, db1)
	}

	ud, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "ud", Provider: "pve", Flavor: "small",
		Image: "debian-12-cloud", UserData: "#cloud-config\n"})
	if err != nil {
		t.Fatal(err)
	}
	ud = e.waitInstance(t, ud.ID, "error", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderError })
	if !strings.Contains(ud.StatusDetail, "SSH keys") {
		t.Errorf("user data at Proxmox: %q", ud.StatusDetail)
	}

	px.Remove(v.VMID)
	e.waitInstance(t, db1.ID, "lost", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderLost })

	db2, err := client.Call(ctx, e.cl, vps.ProviderInstancesCreate, vps.CreateProviderInstance{Name: "db-2", Provider: "pve", Flavor: "small", Image: "9000"})
	if err != nil {
		t.Fatal(err)
	}
	db2 = e.waitInstance(t, db2.ID, "running", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderRunning })
	// Proxmox gave db-2 the VMID db-1's VM had: deleting db-1 leaves db-2's VM alone.
	if !strings.HasPrefix(db2.ServerID, fmt.Sprintf("pve2/%d/", v.VMID)) {
		t.Fatalf("db-2 is %s: the cluster did not reuse VMID %d, which this test is about", db2.ServerID, v.VMID)
	}
	for n, id := range []string{db1.ID, db2.ID} {
		if _, err := client.Call(ctx, e.cl, vps.ProviderInstancesDelete, vps.ProviderInstanceRef{Instance: id}); err != nil {
			t.Fatal(err)
		}
		e.waitInstance(t, id, "deleted", func(i vps.ProviderInstance) bool { return i.Status == vps.ProviderDeleted })
		if vms := px.VMs(); len(vms) != 1-n {
			t.Fatalf("after deleting %s the cluster has %+v", id, vms)
		}
	}
}

// TestProviderInputsNameTheirField: each bad input of the provider methods is refused with
// invalid_argument naming the field, and no message repeats a token.
func TestProviderInputsNameTheirField(t *testing.T) {
	t.Parallel()
	ok := vps.CreateProviderInstance{Name: "web", Provider: "hz", Flavor: "small", Image: "ubuntu-24.04"}
	for _, c := range []struct {
		in    interface{ Validate() error }
		field string
	}{
		{func() vps.CreateProviderInstance { i := ok; i.Image = ""; return i }(), "image"},
		{func() vps.CreateProviderInstance { i := ok; i.Provider = ""; return i }(), "provider"},
		{func() vps.CreateProviderInstance { i := ok; i.Name = "Web_1"; return i }(), "name"},
		{func() vps.CreateProviderInstance {
			i := ok
			i.SSHKeys = []string{sshKey, "ssh-rsa notbase64"}
			return i
		}(), "sshKeys[1]"},
		{func() vps.CreateProviderInstance { i := ok; i.SSHKeys = []string{sshKey + "\n" + sshKey}; return i }(), "sshKeys[0]"},
		{func() vps.CreateProviderInstance {
			i := ok
			i.UserData = strings.Repeat("x", vps.MaxProviderUserData+1)
			return i
		}(), "userData"},
		{func() vps.CreateProviderInstance { i := ok; i.Labels = map[string]string{"-bad": "x"}; return i }(), "labels"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner"}, "token"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner", Token: "tok\x00en-Secret"}, "token"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner", Token: strings.Repeat("s", vps.MaxProviderToken+1)}, "token"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner", Token: "t", Options: map[string]string{"no-dash": "x"}}, "options"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner", Token: "t", MaxInstances: -1}, "maxInstances"},
		{vps.CreateProviderAccount{Name: "hz", Kind: "hetzner", Token: "t", Flavors: map[string]string{"Small": "cx22"}}, "flavors"},
		{vps.ListProviderInstances{Status: "gone"}, "status"},
		{vps.ReinstallProviderInstance{}, "instance"},
		{vps.ProviderAccountRef{}, "account"},
	} {
		err := c.in.Validate()
		if ae := apiErr(err); ae.Code != api.CodeInvalidArgument || ae.Details["field"] != c.field {
			t.Errorf("%T %v: want invalid %s", c.in, err, c.field)
		}
		if err != nil && strings.Contains(err.Error(), "Secret") {
			t.Errorf("%v repeats the token", err)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("a good input: %v", err)
	}
}

// TestProviderEndpointsAreCheckedByTheOutboundPolicy: under the default outbound policy an
// account's endpoint at a refused address, in any spelling, is refused naming endpoint, before
// the provider is asked; the same endpoint is reached once the operator allows its range.
func TestProviderEndpointsAreCheckedByTheOutboundPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startProvidersWith(t, func(o *compute.Options) { o.Outbound = compute.OutboundOptions{} })
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimSuffix(e.hz.Endpoint(), "/v1"), "http://"))
	for _, h := range []string{"127.0.0.1", "127.1", "0x7f000001", "2130706433", "017700000001", "127.000.000.001", "localhost", "[::1]",
		"[0000:0000::0002]", "169.254.169.254", "[::ffff:a9fe:a9fe]", "192.0.2.10", "10.1"} {
		endpoint := "http://" + h + ":" + port + "/v1"
		_, err := client.Call(ctx, e.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name, Endpoint: endpoint, Token: hzToken})
		if ae := apiErr(err); ae.Code != api.CodeInvalidArgument || ae.Details["field"] != "endpoint" || ae.Details["reason"] != "refused_by_outbound_policy" {
			t.Errorf("an endpoint at %s: %v, want invalid_argument naming endpoint", endpoint, err)
		}
	}
	if n := len(e.hz.Requests()); n != 0 {
		t.Errorf("the provider was asked %d times; the refused endpoints must not be reached", n)
	}

	allowed := startProvidersWith(t, func(o *compute.Options) {
		o.Outbound.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	if _, err := client.Call(ctx, allowed.cl, vps.ProviderAccountsCreate, vps.CreateProviderAccount{Name: "hz", Kind: hetzner.Name,
		Endpoint: allowed.hz.Endpoint(), Token: hzToken}); err != nil {
		t.Errorf("an endpoint in an allowed range: %v", err)
	}
}
