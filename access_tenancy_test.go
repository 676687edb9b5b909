package compute_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/access"
	"github.com/better-compute/compute/internal/core/nodes"
)

// TestTenantsSharingANodeGetNoRoot: the control plane's half of "tenants sharing a node"
// (docs/security.md). Two child tenants each hold two GPUs of the root tenant's 8-GPU node:
// their commands are confined to their reservations' users (the ticket says which, and the
// node's desired state puts their SSH principals on their own users, none on the operator
// login); their break-glass is refused; the node's console is refused them, and so is any
// console a module serves, named by hand; the node's operator gets root with break-glass; a
// holder of the whole node gets root, until another reservation comes.
func TestTenantsSharingANodeGetNoRoot(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env := ff.env
	ctx := context.Background()
	a, rootKey := env.Compute.API, env.RootKey
	tenantA, keyA := env.Tenant(t, "ta")
	_, keyB := env.Tenant(t, "tb")
	resA, err := a.Reservations.Create(ctx, keyA, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	resB, err := a.Reservations.Create(ctx, keyB, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	var ae *api.Error
	code := func(err error) api.Code {
		if errors.As(err, &ae) {
			return ae.Code
		}
		return ""
	}
	sshAccess := func() api.SSHAccess {
		t.Helper()
		ds, err := nodes.Desired(ctx, env.DB.Pool, ff.nodeID, env.Compute.Runtime().Registry.DesiredKinds())
		if err != nil {
			t.Fatal(err)
		}
		var out api.SSHAccess
		for _, p := range ds.GetParts() {
			if p.GetKind() == api.SSHAccessKind {
				if err := json.Unmarshal(p.GetPayload(), &out); err != nil {
					t.Fatal(err)
				}
			}
		}
		return out
	}

	ticket, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: resA.ID, Command: []string{"id"}})
	if err != nil || ticket.Root || ticket.User != api.ReservationUser(resA.ID) {
		t.Fatalf("a holder of part of the node's exec ticket: %+v, %v", ticket, err)
	}
	if api.ReservationUser(resA.ID) == api.ReservationUser(resB.ID) || len(api.ReservationUser(resA.ID)) > 32 {
		t.Fatalf("reservation users %q and %q", api.ReservationUser(resA.ID), api.ReservationUser(resB.ID))
	}
	if got := sshAccess(); len(got.Principals) != 0 || len(got.Holders) != 2 ||
		!slices.ContainsFunc(got.Holders, func(h api.SSHHolder) bool {
			return h.Reservation == resA.ID && slices.Equal(h.Principals, []string{api.ReservationPrincipal(resA.ID)})
		}) {
		t.Fatalf("the node's SSH access with two partial holders: %+v", got)
	}
	cert, err := a.Access.SSHCertificate(ctx, keyA, api.SignSSHKey{Reservation: resA.ID, PublicKey: fuzzSSHKey})
	if err != nil || cert.User != api.ReservationUser(resA.ID) || !slices.Equal(cert.Principals, []string{api.ReservationPrincipal(resA.ID)}) {
		t.Fatalf("a partial holder's certificate: %+v, %v", cert, err)
	}

	// Root is not a partial holder's, with or without a reason.
	if _, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: resA.ID, Command: []string{"id"}, BreakGlass: true, Reason: "x"}); code(err) != api.CodePermissionDenied {
		t.Fatalf("a partial holder's break-glass exec: %v", err)
	}
	if _, err := a.Access.SSHCertificate(ctx, keyA, api.SignSSHKey{Reservation: resA.ID, PublicKey: fuzzSSHKey, BreakGlass: true, Reason: "x"}); code(err) != api.CodePermissionDenied {
		t.Fatalf("a partial holder's break-glass certificate: %v", err)
	}
	if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: resA.ID}); code(err) != api.CodePermissionDenied {
		t.Fatalf("a partial holder's ticket to the node's console: %v", err)
	}
	if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: resB.ID}); code(err) != api.CodeNotFound {
		t.Fatalf("a ticket with another tenant's reservation: %v", err)
	}
	// Any console a module serves ("kind:id") is refused at access.console, whoever asks: its
	// module makes the ticket, for its owner.
	rapid.Check(t, func(rt *rapid.T) {
		name := rapid.StringMatching(`[a-z]{0,8}:[a-z0-9-]{0,20}`).Draw(rt, "console")
		key := rapid.SampledFrom([]string{keyA, rootKey}).Draw(rt, "caller")
		in := api.OpenTunnel{Reservation: resA.ID, Console: name}
		if key == rootKey {
			in = api.OpenTunnel{Node: ff.nodeID, Console: name}
		}
		if _, err := a.Access.Console(ctx, key, in); code(err) != api.CodeInvalidArgument || !strings.Contains(ae.Message, "module") {
			rt.Fatalf("access.console %q: %v", name, err)
		}
	})

	// The node's operator (the root tenant owns p1): root with break-glass, on the held node.
	if _, err := a.Access.Exec(ctx, rootKey, api.OpenTunnel{Node: ff.nodeID, Command: []string{"id"}}); code(err) != api.CodeInvalidArgument {
		t.Fatalf("an operator's exec on a held node without break-glass: %v", err)
	}
	ticket, err = a.Access.Exec(ctx, rootKey, api.OpenTunnel{Node: ff.nodeID, Command: []string{"id"}, BreakGlass: true, Reason: "pager"})
	if err != nil || !ticket.Root {
		t.Fatalf("an operator's break-glass exec: %+v, %v", ticket, err)
	}
	ticket, err = a.Access.Exec(ctx, rootKey, api.OpenTunnel{TenantID: tenantA, Reservation: resA.ID, Command: []string{"id"}, BreakGlass: true, Reason: "pager"})
	if err != nil || !ticket.Root {
		t.Fatalf("an operator's break-glass exec by a tenant's reservation: %+v, %v", ticket, err)
	}
	bg, err := a.Access.SSHCertificate(ctx, rootKey, api.SignSSHKey{TenantID: tenantA, Reservation: resA.ID, PublicKey: fuzzSSHKey, BreakGlass: true, Reason: "pager"})
	if err != nil || !slices.Contains(bg.Principals, api.BreakGlassPrincipal(resA.ID)) {
		t.Fatalf("an operator's break-glass certificate: %+v, %v", bg, err)
	}
	if got := sshAccess(); !slices.Equal(got.Principals, []string{api.BreakGlassPrincipal(resA.ID)}) {
		t.Fatalf("the operator login's principals with a break-glass certificate: %v", got.Principals)
	}
	if _, err := a.Access.Revoke(ctx, rootKey, api.RevokeSSHCertificate{TenantID: tenantA, Serial: bg.Serial}); err != nil {
		t.Fatal(err)
	}
	if got := sshAccess(); len(got.Principals) != 0 {
		t.Fatalf("the operator login's principals once the break-glass certificate is revoked: %v", got.Principals)
	}

	// A holder of the whole node: root, its principal on the operator login too.
	for _, r := range []struct{ key, id string }{{keyA, resA.ID}, {keyB, resB.ID}} {
		if _, err := a.Reservations.Release(ctx, r.key, api.ReleaseReservation{Reservation: r.id}); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := a.Reservations.Create(ctx, keyA, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	ticket, err = a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: whole.ID, Command: []string{"id"}})
	if err != nil || !ticket.Root || ticket.User != "" {
		t.Fatalf("a whole holder's exec ticket: %+v, %v", ticket, err)
	}
	if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: whole.ID}); err != nil {
		t.Fatalf("a whole holder's ticket to the node's console: %v", err)
	}
	if got := sshAccess(); !slices.Equal(got.Principals, []string{api.ReservationPrincipal(whole.ID)}) || len(got.Holders) != 1 {
		t.Fatalf("the node's SSH access with a whole holder: %+v", got)
	}
	// Another reservation comes (vCPUs alone): the whole holder's unspent root ticket opens
	// nothing, and its principal leaves the operator login.
	late, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: whole.ID, Command: []string{"id"}})
	if err != nil || !late.Root {
		t.Fatalf("a whole holder's exec ticket: %+v, %v", late, err)
	}
	if _, err := a.Reservations.Create(ctx, keyB, api.CreateReservation{Pool: "p1", Shape: api.Shape{VCPUs: 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := access.SpendTicket(ctx, env.DB, late.Ticket); !errors.Is(err, access.ErrTicket) {
		t.Fatalf("a root ticket spent once its holder no longer holds the whole node: %v", err)
	}
	if got := sshAccess(); len(got.Principals) != 0 || len(got.Holders) != 2 {
		t.Fatalf("the node's SSH access once another reservation came: %+v", got)
	}
}
