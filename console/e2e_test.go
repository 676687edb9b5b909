package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/console"
	"github.com/better-compute/compute/devserver"
	"github.com/better-compute/compute/metal"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConsoleDrivesTheDevserver is a person at the console of a devserver with two simulated
// machines (16 H100s): signing in, the pools and the fleet map, reserving GPUs and finding the
// holder on the map, a node's page, cordoning, a command and its result, releasing, an event
// arriving live, an error shown as the API gives it, webhooks, machines and workflows. Each
// view is checked for accessibility and photographed.
func TestConsoleDrivesTheDevserver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the devserver and a browser")
	}
	b := newBrowser(t, 1400, 1000)
	s := startDevserver(t)
	ctx := context.Background()
	a := s.Compute.API

	// The second machine's last GPUs in MIG and time-slice mode, a slice and a share of them
	// held; a booking in the future there too (by a label), for the timeline.
	second, err := a.Nodes.Get(ctx, s.APIKey, api.GetNode{Pool: devserver.SimPool, Node: "sim-00001"})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := a.Devices.List(ctx, s.APIKey, api.ListDevices{Node: second.ID})
	if err != nil || len(devs) != 8 {
		t.Fatalf("devices of %s = %d, %v", second.Name, len(devs), err)
	}
	for _, m := range []api.SetGPUMode{{Device: devs[7].ID, Mode: api.GPUModeMIG}, {Device: devs[6].ID, Mode: api.GPUModeTimeSlice, Shares: 4}} {
		if _, err := a.Devices.SetMode(ctx, s.APIKey, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, shape := range []api.Shape{{MIGProfile: "3g.40gb", Model: "h100"}, {TimeSlice: true, Model: "h100"}} {
		if _, err := a.Reservations.Create(ctx, s.APIKey, api.CreateReservation{Pool: devserver.SimPool, Shape: shape}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Nodes.SetLabels(ctx, s.APIKey, api.SetNodeLabels{NodeRef: api.NodeRef{Node: second.ID}, Labels: map[string]string{"rack": "b"}}); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(3 * time.Hour).Truncate(time.Minute)
	future, err := a.Reservations.Create(ctx, s.APIKey, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 4},
		RequireLabels: map[string]string{"rack": "b"}, Start: &later, Duration: "6h"})
	if err != nil || future.Allocations[0].NodeID != second.ID {
		t.Fatalf("the future booking = %+v, %v; want it on %s", future, err, second.Name)
	}

	// Sign in: a wrong key is refused with the API's own error; the right one opens the pools.
	b.run("open the console", chromedp.Navigate(s.Console), chromedp.WaitVisible(chromedp.CSS("#api-key")))
	b.checkA11y("sign-in")
	b.shot("signin")
	_, wrong := a.Pools.List(ctx, "biam_key_wrong", api.ListPools{})
	b.run("a wrong key", set("#api-key", "biam_key_wrong"), chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#signin-result .error")))
	if got, want := b.text("#signin-result .error .code"), api.CodeOf(wrong); got != string(want) {
		t.Errorf("sign-in with a wrong key shows %q, the API answers %q", got, want)
	}
	b.run("sign in", set("#api-key", s.APIKey), chromedp.Click(chromedp.CSS("#signin-submit")),
		waitJS(`document.querySelector('article.pool[data-pool="gpu"] .partitioned table, article.pool[data-pool="gpu"] .partitioned p:not(:empty)') !== null && !document.querySelector('.partitioned p.muted')?.textContent.startsWith('Reading')`))
	if got := b.text(`article.pool[data-pool="gpu"] table tbody tr`); !strings.Contains(got, "h100") || !strings.Contains(got, "14") {
		t.Errorf("the pool gpu shows %q, want its 14 whole H100s", got)
	}
	if got := b.text(`article.pool[data-pool="gpu"] .partitioned table tbody`); !strings.Contains(got, "4 of 8 memory slices") || !strings.Contains(got, "1 of 4 shares") {
		t.Errorf("the pool's MIG and time-slices show %q, want 4 of 8 memory slices and 1 of 4 shares held", got)
	}
	b.checkA11y("pools")
	b.shot("pools")

	// The fleet map: 2 nodes, 16 GPUs, 4 of them booked from later on but free now.
	b.run("the fleet map", view("fleet"), waitJS(`document.getElementById('fleet-timing').dataset.ready === 'true'`))
	if got := b.text("#fleet-summary"); got != "2 nodes, 16 GPUs: 14 free, 2 partly held" {
		t.Errorf("fleet summary = %q", got)
	}

	// Reserve 8 GPUs: the earliest window first, then the reservation, confirmed.
	b.run("the reservations", view("reservations"), waitJS(`document.querySelector('#res-pool option[value="gpu"]') !== null`),
		waitJS(fmt.Sprintf(`document.querySelector('.timeline a[title=%q]') !== null`, future.ID)))
	b.run("find a window", set("#res-gpus", "8"), set("#res-duration", "2h"),
		chromedp.Click(chromedp.CSS("#res-find")), chromedp.WaitVisible(chromedp.CSS("#availability-window")))
	if got := b.text("#availability-window"); !strings.HasPrefix(got, "Earliest window:") {
		t.Errorf("availability shows %q", got)
	}
	b.run("reserve", set("#res-duration", ""), chromedp.Click(chromedp.CSS("#res-submit")), confirm(),
		chromedp.WaitVisible(chromedp.CSS("#reserved-id")))
	resID := value(b, "read the reservation", chromedp.AttributeValue(chromedp.CSS("#reserved-id"), "data-id")).Value
	r, err := a.Reservations.Get(ctx, s.APIKey, api.GetReservation{Reservation: resID})
	if err != nil || r.State != api.ReservationActive || len(r.Allocations) != 1 || len(r.Allocations[0].GPUs) != 8 {
		t.Fatalf("the console's reservation = %+v, %v; want 8 GPUs, active", r, err)
	}
	b.checkA11y("reservations")
	b.shot("reservations")

	// The holder on the map: a click on one of its GPUs names the reservation.
	al := r.Allocations[0]
	b.run("the map again", view("fleet"), waitJS(`document.getElementById('fleet-timing').dataset.ready === 'true'`))
	at := eval[struct{ X, Y float64 }](b, fmt.Sprintf(`window.bcConsole.fleetMap.cellCenter(%q, %d)`, al.NodeID, al.GPUs[3].Index))
	b.run("click it", chromedp.MouseClickXY(at.X, at.Y),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#fleet-detail-holders a[data-reservation=%q]`, resID))))
	if got := b.text("#fleet-detail-state"); got != "held" {
		t.Errorf("the reserved GPU's state on the map = %q", got)
	}
	if got := b.text("#fleet-summary"); got != "2 nodes, 16 GPUs: 6 free, 8 held, 2 partly held" {
		t.Errorf("fleet summary after the reservation = %q", got)
	}
	// The keyboard moves along the map.
	b.run("keyboard", chromedp.Focus(chromedp.CSS("#fleet-canvas")), chromedp.KeyEvent(kb.ArrowRight),
		waitJS(`document.querySelector('#fleet-detail h2') !== null`))
	b.checkA11y("fleet map")
	b.shot("fleet")

	// The node's page: its GPUs with their holder; cordon and uncordon, confirmed; a command.
	b.run("the node", view("node/"+al.NodeID), waitJS(fmt.Sprintf(`[...document.querySelectorAll('table a')].some((a) => a.title === %q)`, resID)))
	b.run("cordon", chromedp.Click(chromedp.Search(`//button[text()="Cordon"]`)), confirm(), waitJS(`document.querySelector('main .result .ok') !== null`))
	if n, err := a.Nodes.Get(ctx, s.APIKey, api.GetNode{Node: al.NodeID}); err != nil || n.State != api.NodeCordoned {
		t.Errorf("after Cordon the node is %+v, %v", n.State, err)
	}
	b.run("send a command", set("#cmd-kind", "health.check"), chromedp.Click(chromedp.Search(`//button[text()="Send…"]`)), confirm(),
		waitJS(`[...document.querySelectorAll('main .result .ok')].some((e) => e.textContent.includes('health.check'))`))
	b.checkA11y("node")
	b.shot("node")
	b.run("uncordon", chromedp.Click(chromedp.Search(`//button[text()="Uncordon"]`)), confirm(), waitJS(`document.querySelector('main .result .ok')?.textContent.includes('active')`))
	if n, err := a.Nodes.Get(ctx, s.APIKey, api.GetNode{Node: al.NodeID}); err != nil || n.State != api.NodeActive {
		t.Errorf("after Uncordon the node is %+v, %v", n.State, err)
	}
	// Drain lets what holds the node run out; a second Uncordon makes it bookable again.
	b.run("drain", chromedp.Click(chromedp.Search(`//button[text()="Drain"]`)), confirm(), waitJS(`document.querySelector('main .result .ok')?.textContent.includes('draining')`))
	if n, err := a.Nodes.Get(ctx, s.APIKey, api.GetNode{Node: al.NodeID}); err != nil || n.State != api.NodeDraining {
		t.Errorf("after Drain the node is %+v, %v", n.State, err)
	}
	if r, err := a.Reservations.Get(ctx, s.APIKey, api.GetReservation{Reservation: resID}); err != nil || r.State != api.ReservationActive {
		t.Errorf("a drain that does not end reservations left %s, %v", r.State, err)
	}
	b.run("uncordon again", chromedp.Click(chromedp.Search(`//button[text()="Uncordon"]`)), confirm(), waitJS(`document.querySelector('main .result .ok')?.textContent.includes('active')`))

	// The nodes, a virtualised list, filtered by name.
	b.run("the nodes", view("nodes"), waitJS(`document.querySelectorAll('.vtable .vspacer .vrow').length === 2`),
		set("#node-filter", "sim-00001"), waitJS(`document.querySelectorAll('.vtable .vspacer .vrow').length === 1`))
	b.checkA11y("nodes")
	b.shot("nodes")

	// The command's result, as the node answered it.
	b.run("the commands", view("commands"), waitJS(`[...document.querySelectorAll('.vtable .vrow')].some((r) => r.textContent.includes('health.check') && r.textContent.includes('succeeded'))`))
	b.checkA11y("commands")
	b.shot("commands")

	// Release, confirmed, from the reservation's own page.
	b.run("release", view("reservations?focus="+resID), chromedp.WaitVisible(chromedp.CSS("#focus-release")),
		chromedp.Click(chromedp.CSS("#focus-release")), confirm(), waitJS(`document.querySelector('#focus-state')?.textContent === 'released'`))
	if r, err := a.Reservations.Get(ctx, s.APIKey, api.GetReservation{Reservation: resID}); err != nil || r.State != api.ReservationReleased {
		t.Errorf("after Release the reservation is %s, %v", r.State, err)
	}

	// An error, shown as the API gives it: nine GPUs on machines of eight.
	nine := api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 9}}
	_, refused := a.Reservations.Create(ctx, s.APIKey, nine)
	var want *api.Error
	if !errors.As(refused, &want) {
		t.Fatalf("nine GPUs: %v, want an API error", refused)
	}
	b.run("ask too much", view("reservations"), waitJS(`document.querySelector('#res-pool option[value="gpu"]') !== null`),
		set("#res-gpus", "9"), chromedp.Click(chromedp.CSS("#res-submit")), confirm(),
		chromedp.WaitVisible(chromedp.CSS("#reserve-result .error")))
	if code, msg := b.text("#reserve-result .error .code"), b.text("#reserve-result .error .message"); code != string(want.Code) || msg != want.Message {
		t.Errorf("the console shows %s: %q; the API answers %s: %q", code, msg, want.Code, want.Message)
	}
	b.shot("error")

	// Events, live: one made by an API call while the page is open arrives.
	b.run("the events", view("events"), waitJS(`document.getElementById('ev-state').textContent === 'live'`))
	made, err := a.Reservations.Create(ctx, s.APIKey, api.CreateReservation{Pool: devserver.SimPool, Shape: api.Shape{GPUs: 1}})
	if err != nil {
		t.Fatal(err)
	}
	b.run("the event arrives", waitJS(fmt.Sprintf(`document.querySelector('li.event[data-subject=%q][data-type="reservation.created"]') !== null`, made.ID)))
	b.checkA11y("events")
	b.shot("events")

	// Webhooks: one added (its secret shown once) and listed.
	b.run("the webhooks", view("webhooks"), set("#wh-url", "https://hooks.invalid/compute"),
		set("#wh-types", "ping."), chromedp.Click(chromedp.Search(`//button[text()="Add…"]`)), confirm(),
		chromedp.WaitVisible(chromedp.CSS("#wh-result .secret")), waitJS(`document.querySelector('main table')?.textContent.includes('hooks.invalid')`))
	if got := b.text("#wh-result .secret"); !strings.HasPrefix(got, "whsec_") {
		t.Errorf("the new webhook's secret shows as %q", got)
	}
	b.checkA11y("webhooks")
	b.shot("webhooks")

	// Machines and a workflow's steps: a machine whose BMC is not there (its name does not
	// resolve; a loopback address is refused by the outbound policy), powered on.
	m, err := compute.Invoke(ctx, s.Compute, s.APIKey, metal.MachinesCreate, metal.CreateMachine{Name: "rack1-m1",
		BMC: metal.BMCInput{Driver: "ipmi", Address: "rack1-m1.bmc.invalid:623", Username: "admin", Password: "secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compute.Invoke(ctx, s.Compute, s.APIKey, metal.MachinesPower, metal.PowerMachine{Machine: m.ID, Action: "on"}); err != nil {
		t.Fatal(err)
	}
	b.run("the machines", view("machines"), waitJS(`document.querySelector('main table')?.textContent.includes('rack1-m1')`))
	b.checkA11y("machines")
	b.shot("machines")
	b.run("the workflows", view("workflows"), waitJS(`document.querySelector('.stepper li') !== null`))
	b.checkA11y("workflows")
	b.shot("workflows")
}

// TestConsoleSignsInWithTheHostSession: a host that hands the console a credential for its own
// session (Options.Console.Session) signs its person in without a key, and the console then sees
// exactly what that credential may: a tenant's person sees the tenant's pools, not the root's.
func TestConsoleSignsInWithTheHostSession(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a browser")
	}
	b := newBrowser(t, 1200, 800)
	var tenantKey string
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) {
		o.Console.Session = func(r *http.Request) (string, error) {
			if c, err := r.Cookie("host-session"); err == nil && c.Value == "acme-person" {
				return tenantKey, nil
			}
			return "", console.ErrNoSession
		}
	}})
	ctx := context.Background()
	tenant, key := env.Tenant(t, "acme")
	tenantKey = key
	for _, p := range []api.CreatePool{{Name: "platform-h100"}, {Name: "acme-a100", TenantID: tenant}} {
		if _, err := env.Compute.API.Pools.Create(ctx, env.RootKey, p); err != nil {
			t.Fatal(err)
		}
	}
	url := env.Server(t)

	// No session: the key form, with the offer of the session.
	b.run("no session yet", chromedp.Navigate(url+"/console/"), chromedp.WaitVisible(chromedp.CSS("#api-key")), chromedp.WaitVisible(chromedp.CSS("#session-title")))
	// The host's cookie: the console signs in by itself.
	b.run("with the host's session", void(chromedp.Evaluate[any](`document.cookie = 'host-session=acme-person; path=/'`)), chromedp.Reload(),
		waitJS(`document.querySelector('article.pool') !== null`))
	if got := b.text("#who"); !strings.Contains(got, "Signed in with your session") {
		t.Errorf("the header says %q", got)
	}
	names := eval[[]string](b, `[...document.querySelectorAll('article.pool')].map((a) => a.dataset.pool)`)
	if len(names) != 1 || names[0] != "acme-a100" {
		t.Errorf("the tenant's person sees the pools %v, want only acme-a100", names)
	}
	// What the page was given is the credential the host answered, kept for this tab only.
	if got := eval[string](b, `sessionStorage.getItem('bc.credential')`); got != tenantKey {
		t.Errorf("the page keeps %q", got)
	}
	// Signing out forgets it; the host's session signs the person in again on the next load.
	b.run("sign out", chromedp.Click(chromedp.Search(`//button[text()="Sign out"]`)), waitJS(`sessionStorage.getItem('bc.credential') === null`))
}
