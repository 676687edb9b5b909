package vps_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/runtime/libvirt"
	"golang.org/x/crypto/ssh"
)

// answers waits until the guest of a sandbox answers a line on its serial console, attaching
// again while it cannot yet (the VM not yet made, its console not yet bound).
func (v *vmHost) answers(t *testing.T, sandbox string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	computetest.Eventually(t, within, "sandbox "+sandbox+"'s guest answers on its console", func() bool {
		ticket, err := compute.Invoke(v.ctx, v.c, v.key, vps.SandboxesConsole, vps.SandboxRef{Sandbox: sandbox})
		if err != nil {
			t.Fatal(err)
		}
		tun, err := v.cl.OpenTunnel(v.ctx, ticket)
		if err != nil {
			return false
		}
		defer tun.Close()
		con := newConsoleReader(v.ctx, tun)
		// Attached, ask again and again: a guest still booting answers a later ping.
		ping := time.NewTicker(100 * time.Millisecond)
		defer ping.Stop()
		end := time.NewTimer(time.Until(deadline))
		defer end.Stop()
		for tun.Write([]byte("ping\n")); ; {
			select {
			case l, ok := <-con.lines:
				if !ok {
					return false // detached: attach again
				}
				if strings.Contains(l, `you said "ping"`) {
					return true
				}
			case <-ping.C:
				tun.Write([]byte("ping\n"))
			case <-end.C:
				return false
			}
		}
	})
}

// applied waits until node has applied the desired state it has now: what a call just changed
// has reached its host.
func (v *vmHost) applied(t *testing.T, node string) {
	t.Helper()
	var want int64
	if err := v.env.DB.Pool.QueryRow(v.ctx, `SELECT generation FROM compute.node_desired WHERE node_id = $1`, node).Scan(&want); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, time.Minute, "the host applies its desired state", func() bool {
		var got int64
		err := v.env.DB.Pool.QueryRow(v.ctx, `SELECT applied_generation FROM compute.node_desired WHERE node_id = $1`, node).Scan(&got)
		return err == nil && got >= want
	})
}

var tickRE = regexp.MustCompile(`bc-guest: tick (\d+)`)

// quiet waits until the console has said nothing for d, as a paused guest's does. The lines on
// their way when the guest paused (through QEMU, bcd, the gateway and the tunnel) may still come,
// a tick or two; a guest that runs on ticks every second, and fails the test at its third line.
func (c *consoleReader) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	var said []string
	for {
		silence := time.NewTimer(d) // the behaviour under test: d without a line
		select {
		case l, ok := <-c.lines:
			silence.Stop()
			if !ok {
				t.Fatal("the console ended")
			}
			if said = append(said, l); len(said) > 2 {
				t.Fatalf("a paused guest talks on: %q", said)
			}
		case <-silence.C:
			return
		}
	}
}

// nextTick returns the number of the next tick the console shows.
func (c *consoleReader) nextTick(t *testing.T, within time.Duration) int {
	t.Helper()
	end := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatal("the console ended")
			}
			if m := tickRE.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		case <-end:
			t.Fatalf("no tick within %s", within)
		}
	}
}

// TestSandboxesOnARealBCDHost: sandboxes on a real bcd VM host over a private libvirtd, under
// TCG. A cold sandbox boots with its template's env; a warm pool's instance boots, runs its
// warmup and waits paused, and a sandbox taken from it answers on its console far sooner than a
// cold one does (both measured and printed: docs/benchmarks.md records them); a sandbox pauses
// (its guest falls silent) and resumes; a snapshot with memory is saved and restored (the guest
// counts on from where it was saved); deleting everything leaves no VM.
func TestSandboxesOnARealBCDHost(t *testing.T) {
	t.Parallel()
	v := startVMHost(t)
	ctx, c, key := v.ctx, v.c, v.key
	if _, err := compute.Invoke(ctx, c, key, vps.FlavorsCreate, vps.CreateFlavor{Name: "tiny", VCPUs: 1, MemoryGiB: 1}); err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range []vps.CreateSandboxTemplate{
		{Name: "cold", Pool: "vms", Flavor: "tiny", Image: "guest", Env: map[string]string{"GREETING": "hello", "LANG": "C.UTF-8"}},
		{Name: "warm", Pool: "vms", Flavor: "tiny", Image: "guest", Warm: 1, ReadyLine: "bc-guest: tick"},
	} {
		if _, err := compute.Invoke(ctx, c, key, vps.SandboxTemplatesCreate, tmpl); err != nil {
			t.Fatal(err)
		}
	}

	// Cold: booked, booted, answering.
	start := time.Now()
	cold, err := compute.Invoke(ctx, c, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "cold", Name: "cold1"})
	if err != nil || cold.FromWarmPool {
		t.Fatalf("a cold sandbox: %+v %v", cold, err)
	}
	v.answers(t, "cold1", 3*time.Minute)
	coldLatency := time.Since(start)
	ticket, err := compute.Invoke(ctx, c, key, vps.SandboxesConsole, vps.SandboxRef{Sandbox: "cold1"})
	if err != nil {
		t.Fatal(err)
	}
	con := v.console(t, ticket)
	con.tun.Write([]byte("env\n"))
	con.expect(t, `bc-guest: env GREETING=hello`, 30*time.Second)
	con.expect(t, `bc-guest: env LANG=C.UTF-8`, 30*time.Second)
	con.tun.Close() // a serial console takes one client at a time

	// Exec over SSH: a short-lived certificate for the sandbox's reservation, over its second
	// serial port; a certificate for another reservation is refused, and so is a revoked one.
	type certificate struct {
		signer ssh.Signer
		serial int64
	}
	certFor := func(reservation string) certificate {
		t.Helper()
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		signer, _ := ssh.NewSignerFromKey(priv)
		issued, err := c.API.Access.SSHCertificate(ctx, key, api.SignSSHKey{Reservation: reservation,
			PublicKey: string(ssh.MarshalAuthorizedKey(signer.PublicKey())), TTL: "5m"})
		if err != nil {
			t.Fatal(err)
		}
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(issued.Certificate))
		if err != nil {
			t.Fatal(err)
		}
		certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
		if err != nil {
			t.Fatal(err)
		}
		return certificate{signer: certSigner, serial: issued.Serial}
	}
	login := func(reservation string, cert certificate, command string) (string, error) {
		t.Helper()
		ticket, err := compute.Invoke(ctx, c, key, vps.SandboxesSSH, vps.SandboxRef{Sandbox: "cold1"})
		if err != nil {
			t.Fatal(err)
		}
		tun, err := v.cl.OpenTunnel(ctx, ticket)
		if err != nil {
			t.Fatal(err)
		}
		conn := tun.NetConn(ctx)
		defer conn.Close()
		stop := time.AfterFunc(30*time.Second, func() { conn.Close() }) // a handshake that hangs
		defer stop.Stop()
		// The host key is the guest's, made at its boot: what vouches for the far end is the
		// ticket's path (the API, the node's session, the host's socket).
		sc, chans, reqs, err := ssh.NewClientConn(conn, "sandbox", &ssh.ClientConfig{User: api.ReservationPrincipal(reservation),
			Auth: []ssh.AuthMethod{ssh.PublicKeys(cert.signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: time.Minute})
		if err != nil {
			return "", err
		}
		cli := ssh.NewClient(sc, chans, reqs)
		defer cli.Close()
		sess, err := cli.NewSession()
		if err != nil {
			return "", err
		}
		out, err := sess.Output(command)
		return string(out), err
	}
	run := func(reservation, command string) (string, error) {
		t.Helper()
		return login(reservation, certFor(reservation), command)
	}
	var out string
	computetest.Eventually(t, 3*time.Minute, "SSH to the sandbox", func() bool {
		began := time.Now()
		out, err = run(cold.ReservationID, "echo hello over ssh")
		t.Logf("exec over SSH took %s: %v", time.Since(began).Round(time.Millisecond), err)
		return err == nil
	})
	if out != "hello over ssh\n" {
		t.Fatalf("exec over SSH: %q", out)
	}
	if _, err := run(cold.ReservationID, "rm -rf /"); err == nil || !strings.Contains(err.Error(), "127") {
		t.Fatalf("a command the guest does not have: %v", err)
	}
	// Revoked: once its host has the state that follows access.revoke, the next login with the
	// certificate is refused in the guest; another certificate of the reservation logs in still.
	revoked, kept := certFor(cold.ReservationID), certFor(cold.ReservationID)
	if out, err := login(cold.ReservationID, revoked, "echo before"); err != nil || out != "before\n" {
		t.Fatalf("a certificate before its revocation: %q %v", out, err)
	}
	if _, err := c.API.Access.Revoke(ctx, key, api.RevokeSSHCertificate{Serial: revoked.serial}); err != nil {
		t.Fatal(err)
	}
	v.applied(t, cold.NodeID)
	if out, err := login(cold.ReservationID, revoked, "echo after"); err == nil {
		t.Fatalf("a revoked certificate logged in to the sandbox: %q", out)
	}
	if out, err := login(cold.ReservationID, kept, "echo kept"); err != nil || out != "kept\n" {
		t.Fatalf("another certificate of the reservation after a revocation: %q %v", out, err)
	}

	// Warm: one waits paused; taken, it answers as soon as it is resumed.
	computetest.Eventually(t, 3*time.Minute, "a warm instance waits", func() bool {
		tm, err := compute.Invoke(ctx, c, key, vps.SandboxTemplatesGet, vps.SandboxTemplateRef{Template: "warm"})
		return err == nil && tm.WarmReady == 1
	})
	start = time.Now()
	warm, err := compute.Invoke(ctx, c, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "warm", Name: "warm1"})
	if err != nil || !warm.FromWarmPool {
		// Why no warm instance was taken: the warm instances, their hosts and nodes.
		computetest.LogRows(t, v.env.DB.Pool, "warm instance now", `SELECT format('%s %s/%s host unreachable %L node %s', w.id, w.power, w.status, h.unreachable, n.status)
			FROM compute.vps_instances w LEFT JOIN compute.vps_hosts h ON h.node_id = w.node_id LEFT JOIN compute.nodes n ON n.id = w.node_id
			WHERE w.kind = 'warm' AND w.deleted_at IS NULL`)
		t.Fatalf("a warm sandbox: %+v %v", warm, err)
	}
	v.answers(t, "warm1", time.Minute)
	warmLatency := time.Since(start)
	if _, err := run(warm.ReservationID, "echo not yours"); err == nil {
		t.Fatal("a certificate for another sandbox's reservation opened cold1's SSH")
	}
	t.Logf("sandbox create → its guest answers on its console: cold %s, from the warm pool %s (TCG, no KVM)", coldLatency.Round(time.Millisecond), warmLatency.Round(time.Millisecond))
	if warmLatency*2 > coldLatency {
		t.Errorf("a sandbox from the warm pool answered in %s, a cold one in %s: the pool should at least halve it", warmLatency, coldLatency)
	}

	// Paused, the guest is silent; resumed, it answers.
	status := func(name, want string) {
		t.Helper()
		computetest.Eventually(t, time.Minute, name+" "+want, func() bool {
			s, err := compute.Invoke(ctx, c, key, vps.SandboxesGet, vps.SandboxRef{Sandbox: name})
			return err == nil && s.Status == want
		})
	}
	ticket, err = compute.Invoke(ctx, c, key, vps.SandboxesConsole, vps.SandboxRef{Sandbox: "warm1"})
	if err != nil {
		t.Fatal(err)
	}
	wcon := v.console(t, ticket)
	wcon.nextTick(t, 30*time.Second)
	if _, err := compute.Invoke(ctx, c, key, vps.SandboxesPause, vps.SandboxRef{Sandbox: "warm1"}); err != nil {
		t.Fatal(err)
	}
	status("warm1", "paused")
	wcon.quiet(t, 2500*time.Millisecond)
	if _, err := compute.Invoke(ctx, c, key, vps.SandboxesResume, vps.SandboxRef{Sandbox: "warm1"}); err != nil {
		t.Fatal(err)
	}
	status("warm1", "running")
	wcon.nextTick(t, 30*time.Second)
	wcon.tun.Close()

	// A snapshot with memory, and back to it. Saving restarts the VM's QEMU, which drops the
	// console: each reading attaches anew, and sees only what the guest says from then on.
	tick := func() int {
		t.Helper()
		var n int
		computetest.Eventually(t, 2*time.Minute, "a tick of cold1", func() bool {
			ticket, err := compute.Invoke(ctx, c, key, vps.SandboxesConsole, vps.SandboxRef{Sandbox: "cold1"})
			if err != nil {
				t.Fatal(err)
			}
			tun, err := v.cl.OpenTunnel(ctx, ticket)
			if err != nil {
				return false
			}
			defer tun.Close()
			rc := newConsoleReader(ctx, tun)
			end := time.After(5 * time.Second)
			for {
				select {
				case l, ok := <-rc.lines:
					if !ok {
						return false
					}
					if m := tickRE.FindStringSubmatch(l); m != nil {
						n, _ = strconv.Atoi(m[1])
						return true
					}
				case <-end:
					return false
				}
			}
		})
		return n
	}
	before := tick()
	snap, err := compute.Invoke(ctx, c, key, vps.SandboxSnapshotsCreate, vps.CreateSnapshot{SandboxRef: vps.SandboxRef{Sandbox: "cold1"}, Name: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 2*time.Minute, "the snapshot is ready", func() bool {
		l, err := compute.Invoke(ctx, c, key, vps.SandboxSnapshotsList, vps.ListSnapshots{SandboxRef: vps.SandboxRef{Sandbox: "cold1"}})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("snapshots: %+v %v", l.Items, err)
		}
		if l.Items[0].Status == "failed" {
			t.Fatalf("the snapshot failed: %s", l.Items[0].StatusDetail)
		}
		return l.Items[0].Status == "ready"
	})
	saved := tick() // the snapshot was saved between before and this
	later := saved
	for later < saved+6 { // the guest runs on well past it; each tick() waits for a later line
		later = tick()
	}
	if _, err := compute.Invoke(ctx, c, key, vps.SandboxSnapshotsRestore, vps.SnapshotRef{Snapshot: snap.ID}); err != nil {
		t.Fatal(err)
	}
	var back int
	computetest.Eventually(t, 2*time.Minute, "the guest counts from its snapshot", func() bool {
		back = tick()
		return back < later
	})
	// Below where it had reached (the wait above): back in time; and not below where the snapshot began.
	if back < before {
		t.Fatalf("restored, the guest counts %d: it was saved between ticks %d and %d, and had reached %d", back, before, saved, later)
	}
	t.Logf("saved between ticks %d and %d, run on to %d, restored: counts from %d", before, saved, later, back)

	// Deleted, and the warm pool's template with them: no VM is left.
	for _, s := range []string{"cold1", "warm1"} {
		if _, err := compute.Invoke(ctx, c, key, vps.SandboxesDelete, vps.SandboxRef{Sandbox: s}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tm := range []string{"cold", "warm"} {
		if _, err := compute.Invoke(ctx, c, key, vps.SandboxTemplatesDelete, vps.SandboxTemplateRef{Template: tm}); err != nil {
			t.Fatal(err)
		}
	}
	rt, err := libvirt.New(libvirt.Options{Socket: v.h.Socket, URI: "qemu:///session", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	computetest.Eventually(t, time.Minute, "no VM is left", func() bool {
		list, err := rt.List(ctx)
		return err == nil && len(list) == 0
	})
	if rs, err := c.API.Reservations.List(ctx, key, api.ListReservations{State: api.ReservationActive}); err != nil || len(rs.Items) != 0 {
		t.Fatalf("active reservations after everything went: %d %v", len(rs.Items), err)
	}
}
