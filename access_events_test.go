package compute_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/events"
)

// TestEveryAccessTicketIsOneEvent: docs/access.md says every ticket and every certificate is one
// event; a black-box count found 5 access.* events for 8 tickets on one reservation. Each
// ticket and certificate here is one access.* event that names the reservation, and listing the
// reservation's events finds them all.
func TestEveryAccessTicketIsOneEvent(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env := ff.env
	ctx := context.Background()
	a, k := env.Compute.API, env.RootKey
	// The whole node: the node's console is its whole holder's (a holder of part of it is refused one).
	res, err := a.Reservations.Create(ctx, k, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}
	type issue struct {
		what string
		call func() error
	}
	var issued []issue
	for range 3 {
		issued = append(issued, issue{"access.exec", func() error {
			_, err := a.Access.Exec(ctx, k, api.OpenTunnel{Reservation: res.ID, Command: []string{"true"}})
			return err
		}})
	}
	for range 2 {
		issued = append(issued, issue{"access.console", func() error {
			_, err := a.Access.Console(ctx, k, api.OpenTunnel{Reservation: res.ID})
			return err
		}})
		issued = append(issued, issue{"access.sshCertificate", func() error {
			_, err := a.Access.SSHCertificate(ctx, k, api.SignSSHKey{Reservation: res.ID, PublicKey: fuzzSSHKey})
			return err
		}})
	}
	issued = append(issued, issue{"access.sshCertificate (break-glass)", func() error {
		_, err := a.Access.SSHCertificate(ctx, k, api.SignSSHKey{Reservation: res.ID, PublicKey: fuzzSSHKey, BreakGlass: true, Reason: "pager"})
		return err
	}})
	for _, is := range issued {
		if err := is.call(); err != nil {
			t.Fatalf("%s: %v", is.what, err)
		}
	}
	if _, err := events.Sequence(ctx, env.DB); err != nil { // events are listed once sequenced
		t.Fatal(err)
	}
	page, err := a.Events.List(ctx, k, api.ListEvents{Type: "access.", PageRequest: api.PageRequest{Limit: api.MaxPageLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != len(issued) {
		var types []string
		for _, e := range page.Items {
			types = append(types, e.Type)
		}
		t.Fatalf("%d tickets and certificates made %d access events: %v", len(issued), len(page.Items), types)
	}
	for _, e := range page.Items {
		if e.Data["reservation"] != res.ID {
			t.Errorf("event %s %s does not name the reservation: %v", e.Type, e.Subject, e.Data)
		}
	}
	mine, err := a.Events.List(ctx, k, api.ListEvents{Subject: res.ID, Type: "access.", PageRequest: api.PageRequest{Limit: api.MaxPageLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine.Items) != len(issued) {
		t.Fatalf("the reservation's access events: %d, want %d (one per ticket and certificate)", len(mine.Items), len(issued))
	}
}
