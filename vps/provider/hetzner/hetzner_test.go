package hetzner_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/provider"
	"github.com/better-compute/compute/vps/provider/hetzner"
	"github.com/better-compute/compute/vps/provider/internal/recorded"
)

// The contract tests replay exchanges recorded from Hetzner Cloud's API documentation
// (testdata/*.json, each naming the page): the server checks every request the client sends
// against the recorded one, and answers as the documentation says Hetzner does. No real
// Hetzner account is used.

const (
	token = "hz-token"
	key   = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINNFpfptrSPFFla0BZdtqfDWQ48ZfWyrkOd1xnInGWod ops@example.com"
	inst  = "0191e8a4-1111-7000-8000-000000000001"
)

// loopback is the outbound policy of the tests: the recorded server listens on loopback.
var loopback, _ = netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})

func account(s *recorded.Server, tok string) provider.Account {
	return provider.Account{Endpoint: s.URL + "/v1", Token: tok, Outbound: loopback}
}

// TestCheckTellsATokenFromARefusedOne: a valid token reads a page of servers; a revoked
// (401) or read-only (403) one is ErrUnauthorized. The endpoint is the tenant's, so the error's
// text is its status and code, and Hetzner's message is the operator's alone (Detail).
func TestCheckTellsATokenFromARefusedOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := hetzner.New()
	if err := p.Check(ctx, account(recorded.Serve(t, "testdata/check.json"), token)); err != nil {
		t.Fatalf("a valid token: %v", err)
	}
	for _, c := range []struct{ file, tok, status, says string }{
		{"testdata/check_unauthorized.json", "revoked", "HTTP 401 (unauthorized)", "unable to authenticate"},
		{"testdata/check_forbidden.json", token, "HTTP 403 (forbidden)", "insufficient permissions"},
	} {
		err := p.Check(ctx, account(recorded.Serve(t, c.file), c.tok))
		if !errors.Is(err, provider.ErrUnauthorized) || !contains(err, c.status) || contains(err, c.says) || !strings.Contains(netpolicy.Detail(err), c.says) {
			t.Errorf("%s: %v (detail %s), want ErrUnauthorized saying %q, and %q in its detail alone", c.file, err, netpolicy.Detail(err), c.status, c.says)
		}
	}
	// The outbound policy decides where the client connects: by default, not to loopback.
	never := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a refused address was reached") }))
	defer never.Close()
	var refused *netpolicy.RefusedError
	if err := p.Check(ctx, provider.Account{Endpoint: never.URL + "/v1", Token: token}); !errors.As(err, &refused) {
		t.Errorf("the default policy and an endpoint on loopback: %v, want refused", err)
	}
	// A token that cannot be a header is refused before any request.
	if err := p.Check(ctx, provider.Account{Endpoint: "http://127.0.0.1:1/v1", Token: "a\nb"}); !errors.Is(err, provider.ErrUnauthorized) {
		t.Errorf("a token with a newline: %v", err)
	}
}

// TestCreateAddsTheKeyAndLabelsTheServer: the SSH key, unknown to the project, is added (named
// for its SHA-256, labelled), the server is created with its type, image, location, key id,
// user data, started, and labelled with the instance's id and managed-by; the answer is mapped
// (creating, its IPv4, the ::1 of its /64).
func TestCreateAddsTheKeyAndLabelsTheServer(t *testing.T) {
	t.Parallel()
	s := recorded.Serve(t, "testdata/create.json")
	got, err := hetzner.New().Create(context.Background(), account(s, token), provider.Spec{
		Name: "bc-" + inst, Type: "cx22", Image: "ubuntu-24.04", Location: "fsn1", SSHKeys: []string{key},
		UserData: "#cloud-config\npackages: [htop]\n", Labels: map[string]string{"better-compute/instance": inst},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Server{ID: "4711", Name: "bc-" + inst, Status: provider.StatusCreating, IPv4: "203.0.113.10", IPv6: "2001:db8:1234::1",
		Created: time.Date(2026, 3, 1, 10, 0, 1, 0, time.UTC)}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
}

// TestCreateMapsHetznersRefusals: a key the project has is used by its id; a name taken is
// ErrExists; an unknown server type is ErrInvalid; a 503 is none of the contract's errors (the
// module retries it); a spec without a type is refused before any request.
func TestCreateMapsHetznersRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := hetzner.New()
	s := recorded.Serve(t, "testdata/create_known_key.json")
	_, err := p.Create(ctx, account(s, token), provider.Spec{Name: "bc-taken", Type: "cx22", Image: "161547269", SSHKeys: []string{key}})
	if !errors.Is(err, provider.ErrExists) || !strings.Contains(netpolicy.Detail(err), "already used") {
		t.Errorf("a taken name: %v, want ErrExists", err)
	}

	s = recorded.Serve(t, "testdata/create_invalid.json")
	_, err = p.Create(ctx, account(s, token), provider.Spec{Name: "bc-x", Type: "cx999", Image: "ubuntu-24.04"})
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(netpolicy.Detail(err), "server_type") {
		t.Errorf("an unknown type: %v, want ErrInvalid naming server_type", err)
	}
	_, err = p.Create(ctx, account(s, token), provider.Spec{Name: "bc-x", Type: "cx22", Image: "ubuntu-24.04"})
	if err == nil || errors.Is(err, provider.ErrInvalid) || errors.Is(err, provider.ErrUnauthorized) || errors.Is(err, provider.ErrExists) {
		t.Errorf("a 503: %v, want an error worth retrying", err)
	}

	if _, err := p.Create(ctx, provider.Account{Endpoint: "http://127.0.0.1:1/v1", Token: token}, provider.Spec{Name: "bc-y", Image: "x"}); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("no server type: %v", err)
	}
	if _, err := p.Create(ctx, provider.Account{Endpoint: "http://127.0.0.1:1/v1", Token: token},
		provider.Spec{Name: "bc-y", Type: "cx22", Image: "x", SSHKeys: []string{"not a key"}}); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("a malformed SSH key: %v", err)
	}
}

// TestDeleteIsDoneWhenTheServerIsGone: DELETE /servers/{id}, and a server already gone (404) is
// not an error; an id that is not Hetzner's is refused.
func TestDeleteIsDoneWhenTheServerIsGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := recorded.Serve(t, "testdata/delete.json")
	p := hetzner.New()
	for range 2 {
		if err := p.Delete(ctx, account(s, token), "4711"); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Delete(ctx, account(s, token), "pve/100"); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("a foreign id: %v", err)
	}
}

// TestReinstallRebuilds: the rebuild action with the image; a server not found is ErrInvalid.
func TestReinstallRebuilds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := recorded.Serve(t, "testdata/rebuild.json")
	p := hetzner.New()
	if err := p.Reinstall(ctx, account(s, token), "4711", "debian-12"); err != nil {
		t.Fatal(err)
	}
	if err := p.Reinstall(ctx, account(s, token), "4712", "debian-12"); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("a server not found: %v", err)
	}
}

// TestListFollowsPagesAndKeepsThePrefix: every page of the managed servers is read, and only
// those of the prefix are returned, with their statuses and addresses mapped.
func TestListFollowsPagesAndKeepsThePrefix(t *testing.T) {
	t.Parallel()
	s := recorded.Serve(t, "testdata/list.json")
	got, err := hetzner.New().List(context.Background(), account(s, token), "bc-")
	if err != nil {
		t.Fatal(err)
	}
	want := []provider.Server{
		{ID: "4711", Name: "bc-" + inst, Status: provider.StatusRunning, IPv4: "203.0.113.10", IPv6: "2001:db8:1234::1", Created: time.Date(2026, 3, 1, 10, 0, 1, 0, time.UTC)},
		{ID: "4712", Name: "bc-0191e8a4-1111-7000-8000-000000000002", Status: provider.StatusStopped, IPv6: "2001:db8:9abc::1", Created: time.Date(2026, 3, 1, 10, 5, 0, 0, time.UTC)},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) })); diff != "" {
		t.Errorf("listed (-want +got):\n%s", diff)
	}
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
