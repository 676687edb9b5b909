package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/better-compute/compute/bcd/internal/tenancy/tenancytest"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
)

// TestTenantsSharingANodeAreConfined: two tenants hold GPUs of one real bcd node (--exec
// --sshd-dir) with a real sshd. Each one's commands and SSH logins run as its reservation's
// own user, which sees its own GPUs' device nodes alone, its own files alone, and none of the
// other's processes (bcd mounts /proc hidepid=2; the test runs bcd and sshd in a mount
// namespace of their own with a /proc of their own, so that the machine's /proc is left as it
// is). Root is a break-glass operator's or a whole holder's; the node's console, a module's
// console named by hand and a partial holder's break-glass are refused; an ended
// reservation's user, processes and home go.
func TestTenantsSharingANodeAreConfined(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("not root: bcd makes a user per reservation, and the test makes device nodes and a mount namespace")
	}
	tenancytest.LockHostUsers(t) // its devices' groups are named as every bcd's are: one per machine
	sshdBin := "/usr/sbin/sshd"
	if _, err := os.Stat(sshdBin); err != nil {
		t.Skip("OpenSSH's sshd is not installed (Debian package openssh-server; .ci/run installs it)")
	}
	for _, tool := range []string{"unshare", "nsenter", "useradd", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (util-linux, passwd, openssh-client)", tool)
		}
	}
	if err := exec.Command("unshare", "--mount", "--propagation", "private", "true").Run(); err != nil {
		t.Skipf("cannot make a mount namespace here: %v", err)
	}
	e := newE2E(t, e2eOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	url, a, rootKey, db := e.URL, e.API, e.RootKey, e.DB.Pool
	tenantA, keyA := e.Tenant(t, "tenant-a")
	_, keyB := e.Tenant(t, "tenant-b")

	// A directory the holders' users may walk through (t.TempDir is root's alone): their
	// homes, and the GPUs' device nodes (character devices as /dev/null is, which open).
	base, err := os.MkdirTemp("", "bcd-tenancy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	home, devRoot := filepath.Join(base, "home"), filepath.Join(base, "dev")
	if err := os.MkdirAll(devRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7", "nvidiactl"} {
		p := filepath.Join(devRoot, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("mknod %s: %v", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil { // as the NVIDIA driver makes them
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = exec.Command("groupdel", "bc-dev-"+name).Run() }) // bcd keeps its device groups
	}

	// The users bcd made, were it stopped before their reservations end (it removes them then).
	var users []string
	t.Cleanup(func() {
		for _, u := range users {
			_ = exec.Command("userdel", u).Run()
		}
	})

	// The node's own console, which a holder of part of it may not attach to.
	dir := t.TempDir()
	sock := filepath.Join(dir, "console.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "node console\r\n")
			c.Close()
		}
	}()

	// sshd reads a user's principals file as that user: its directory is under base. bcd runs
	// in a mount namespace of its own, with a /proc of its own that it remounts hidepid=2.
	sshdDir := filepath.Join(base, "sshd")
	node := e.node(nodeOptions{Name: "shared-node",
		Under: []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", `mount -t proc proc /proc && exec "$@"`, "sh"},
		Args:  []string{"--exec", "--console", "=unix:" + sock, "--sshd-dir", sshdDir, "--home", home, "--dev-root", devRoot}})
	computetest.Eventually(t, e2eWait, "bcd's sshd_config", func() bool {
		_, err := os.Stat(filepath.Join(sshdDir, "sshd_config"))
		return err == nil
	})
	addr := e.sshd(sshdBin, dir, sshdDir, node.Process.Pid)
	e.online("shared-node")

	// Two tenants, two GPUs each, on the one node.
	resA, err := a.Reservations.Create(ctx, keyA, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	resB, err := a.Reservations.Create(ctx, keyB, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	userA, userB := api.ReservationUser(resA.ID), api.ReservationUser(resB.ID)
	users = append(users, userA, userB)
	gpusOf := func(r api.Reservation) []string {
		var out []string
		for _, al := range r.Allocations {
			for _, g := range al.GPUs {
				out = append(out, strconv.Itoa(g.Index))
			}
		}
		slices.Sort(out)
		return out
	}
	clA, _ := client.New(url, client.WithAPIKey(keyA))
	clB, _ := client.New(url, client.WithAPIKey(keyB))
	clRoot, _ := client.New(url, client.WithAPIKey(rootKey))
	run := func(cl *client.Client, in api.OpenTunnel) (string, api.TunnelExit) {
		t.Helper()
		tun, err := cl.Exec(ctx, in)
		if err != nil {
			t.Fatalf("exec %v: %v", in.Command, err)
		}
		var o bytes.Buffer
		e, err := tun.Run(ctx, nil, &o, &o)
		if err != nil {
			t.Fatalf("exec %v: %v", in.Command, err)
		}
		return o.String(), e
	}
	sh := func(cl *client.Client, res api.Reservation, script string) (string, api.TunnelExit) {
		t.Helper()
		return run(cl, api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", script}})
	}
	for _, c := range []struct {
		cl   *client.Client
		res  api.Reservation
		user string
	}{{clA, resA, userA}, {clB, resB, userB}} {
		computetest.Eventually(t, e2eWait, "the holder's own user on the node", func() bool {
			out, e := sh(c.cl, c.res, "id -un")
			return e.ExitCode == 0 && strings.TrimSpace(out) == c.user
		})
	}

	t.Run("each runs as its own user, in its home and cgroup", func(t *testing.T) {
		ticket, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: resA.ID, Command: []string{"true"}})
		if err != nil || ticket.Root || ticket.User != userA {
			t.Fatalf("the ticket of a holder of part of the node: %+v, %v", ticket, err)
		}
		out, e := sh(clA, resA, `id -u; pwd; echo $HOME; grep -c . /proc/self/environ >/dev/null; env | grep -c BETTER_COMPUTE_DATABASE_URL; cat /proc/self/cgroup`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if e.ExitCode != 0 || len(lines) < 4 || lines[0] == "0" || lines[1] != filepath.Join(home, userA) || lines[2] != lines[1] || lines[3] != "0" {
			t.Fatalf("A's command: exit %+v\n%s", e, out)
		}
		if cg := findCgroup2(); cg != "" && !strings.Contains(out, "/better-compute-holders/"+userA) {
			t.Errorf("A's command is not in its cgroup:\n%s", out)
		}
	})

	t.Run("each opens its own GPUs alone", func(t *testing.T) {
		probe := fmt.Sprintf(`for i in 0 1 2 3 4 5 6 7; do if (: < %s/nvidia$i) 2>/dev/null; then echo $i; fi; done`, devRoot)
		for _, c := range []struct {
			cl  *client.Client
			res api.Reservation
		}{{clA, resA}, {clB, resB}} {
			// The device groups follow the desired state, which bcd applies in its own time.
			var out string
			computetest.Eventually(t, e2eWait, "reservation "+c.res.ID+" opens its own GPUs", func() bool {
				out, _ = sh(c.cl, c.res, probe)
				return slices.Equal(strings.Fields(out), gpusOf(c.res))
			})
			if !slices.Equal(strings.Fields(out), gpusOf(c.res)) || len(gpusOf(c.res)) != 2 {
				ls, _ := exec.Command("ls", "-l", devRoot).CombinedOutput()
				id, _ := sh(c.cl, c.res, "id")
				t.Fatalf("reservation %s holds GPUs %v and opens %q\n%s\n%s", c.res.ID, gpusOf(c.res), out, id, ls)
			}
		}
		// The control node every CUDA process needs stays open to all.
		if out, e := sh(clA, resA, ": < "+devRoot+"/nvidiactl && echo ok"); e.ExitCode != 0 || strings.TrimSpace(out) != "ok" {
			t.Fatalf("nvidiactl: %q %+v", out, e)
		}
	})

	t.Run("each reads its own files alone", func(t *testing.T) {
		if out, e := sh(clA, resA, "echo secret-of-a > $HOME/secret && cat $HOME/secret"); e.ExitCode != 0 || strings.TrimSpace(out) != "secret-of-a" {
			t.Fatalf("A's own file: %q %+v", out, e)
		}
		out, e := sh(clB, resB, "cat "+filepath.Join(home, userA, "secret")+"; ls "+filepath.Join(home, userA))
		if e.ExitCode == 0 || strings.Contains(out, "secret-of-a") || !strings.Contains(out, "Permission denied") {
			t.Fatalf("B read A's home: %q %+v", out, e)
		}
	})

	t.Run("neither sees the other's processes", func(t *testing.T) {
		tun, err := clA.Exec(ctx, api.OpenTunnel{Reservation: resA.ID, Command: []string{"sh", "-c", "echo $$; exec env SECRET=of-a sleep 300"}})
		if err != nil {
			t.Fatal(err)
		}
		defer tun.Close()
		r, w := io.Pipe()
		go func() { _, _ = tun.Wait(ctx, w, nil); w.Close() }()
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		pid := strings.TrimSpace(line)
		// Until env has exec'd sleep, the process is env, whose command line names sleep and
		// whose environment does not yet hold SECRET.
		computetest.Eventually(t, e2eWait, "A's sleep", func() bool {
			b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			return strings.HasPrefix(string(b), "sleep\x00")
		})
		if out, e := sh(clA, resA, "cat /proc/"+pid+"/environ | tr '\\0' '\\n' | grep SECRET"); e.ExitCode != 0 || strings.TrimSpace(out) != "SECRET=of-a" {
			t.Fatalf("A reads its own process: %q %+v", out, e)
		}
		out, e := sh(clB, resB, fmt.Sprintf(`ls /proc | grep -x %[1]s; cat /proc/%[1]s/cmdline; cat /proc/%[1]s/environ; kill -0 %[1]s && echo signalled; ps -e -o user= | sort -u`, pid))
		if strings.Contains(out, "sleep") || strings.Contains(out, "of-a") || strings.Contains(out, "signalled") ||
			slices.Contains(strings.Fields(out), pid) || strings.Contains(out, userA) || strings.Contains(out, "root") {
			t.Fatalf("B sees A's process %s (or root's): %q %+v", pid, out, e)
		}
	})

	t.Run("ssh logs each in as its own user", func(t *testing.T) {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		pub, _ := ssh.NewPublicKey(priv.Public())
		line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
		certA, err := a.Access.SSHCertificate(ctx, keyA, api.SignSSHKey{Reservation: resA.ID, PublicKey: line})
		if err != nil || certA.User != userA {
			t.Fatalf("A's certificate: %+v, %v", certA, err)
		}
		certB, err := a.Access.SSHCertificate(ctx, keyB, api.SignSSHKey{Reservation: resB.ID, PublicKey: line})
		if err != nil {
			t.Fatal(err)
		}
		var out string
		computetest.Eventually(t, e2eWait, "A logs in as its own user", func() bool {
			out, err = sshAs(addr, userA, priv, certA.Certificate, "id -un; for i in 0 1 2 3 4 5 6 7; do if (: < "+devRoot+"/nvidia$i) 2>/dev/null; then echo $i; fi; done")
			return err == nil
		})
		if f := strings.Fields(out); len(f) != 3 || f[0] != userA || !slices.Equal(f[1:], gpusOf(resA)) {
			t.Fatalf("A over SSH: %q (holds %v)", out, gpusOf(resA))
		}
		me, _ := user.Current()
		for _, login := range []string{me.Username, "root", userB} {
			if out, err := sshAs(addr, login, priv, certA.Certificate, "id -un"); err == nil {
				t.Fatalf("A's certificate logged in as %s: %q", login, out)
			}
		}
		if _, err := sshAs(addr, userA, priv, certB.Certificate, "id -un"); err == nil {
			t.Fatal("B's certificate logged in as A's user")
		}
		computetest.Eventually(t, e2eWait, "B logs in as its own user", func() bool {
			out, err = sshAs(addr, userB, priv, certB.Certificate, "id -un; cat "+filepath.Join(home, userA, "secret"))
			return strings.HasPrefix(out, userB)
		})
		if strings.Contains(out, "secret-of-a") {
			t.Fatalf("B over SSH read A's file: %q", out)
		}
		// Break-glass is an operator's: A (a tenant holding part of the node) is refused it.
		var ae *api.Error
		_, err = a.Access.SSHCertificate(ctx, keyA, api.SignSSHKey{Reservation: resA.ID, PublicKey: line, BreakGlass: true, Reason: "curious"})
		if !errors.As(err, &ae) || ae.Code != api.CodePermissionDenied {
			t.Fatalf("a partial holder's break-glass certificate: %v", err)
		}
		// The node's operator (the root tenant owns the pool) gets root, with a reason.
		bg, err := a.Access.SSHCertificate(ctx, rootKey, api.SignSSHKey{TenantID: tenantA, Reservation: resA.ID, PublicKey: line, BreakGlass: true,
			Reason: "pager: GPU 3 fell off the bus"})
		if err != nil {
			t.Fatal(err)
		}
		computetest.Eventually(t, e2eWait, "the operator's break-glass login", func() bool {
			out, err = sshAs(addr, me.Username, priv, bg.Certificate, "id -u")
			return err == nil && strings.TrimSpace(out) == "0"
		})
	})

	t.Run("root is a whole holder's or an operator's", func(t *testing.T) {
		var ae *api.Error
		if _, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: resA.ID, Command: []string{"id"}, BreakGlass: true, Reason: "curious"}); !errors.As(err, &ae) || ae.Code != api.CodePermissionDenied {
			t.Fatalf("a partial holder's break-glass exec: %v", err)
		}
		if _, err := a.Access.Exec(ctx, rootKey, api.OpenTunnel{Node: "shared-node", Pool: e2ePool, Command: []string{"id"}}); !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument {
			t.Fatalf("an operator's exec on a held node without break-glass: %v", err)
		}
		out, e := run(clRoot, api.OpenTunnel{Node: "shared-node", Pool: e2ePool, Command: []string{"id", "-u"}, BreakGlass: true, Reason: "pager: disk full"})
		if e.ExitCode != 0 || strings.TrimSpace(out) != "0" {
			t.Fatalf("an operator's break-glass exec: %q %+v", out, e)
		}
		// By a tenant's reservation on the shared node: root too, not refused as a whole
		// holder's root would be.
		out, e = run(clRoot, api.OpenTunnel{TenantID: tenantA, Reservation: resA.ID, Command: []string{"id", "-u"}, BreakGlass: true, Reason: "pager: GPU 3"})
		if e.ExitCode != 0 || strings.TrimSpace(out) != "0" {
			t.Fatalf("an operator's break-glass exec by a tenant's reservation: %q %+v", out, e)
		}
		if n := computetest.Count(t, db, `SELECT count(*) FROM compute.events WHERE type = 'access.break_glass' AND data->>'reason' = 'pager: disk full'`); n != 1 {
			t.Fatalf("%d break-glass events", n)
		}
	})

	t.Run("consoles are their owners' alone", func(t *testing.T) {
		var ae *api.Error
		if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: resA.ID}); !errors.As(err, &ae) || ae.Code != api.CodePermissionDenied {
			t.Fatalf("a partial holder's ticket to the node's console: %v", err)
		}
		for _, name := range []string{"instance:" + resB.ID, "instance:0195", "sandbox-agent:x"} {
			if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: resA.ID, Console: name}); !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument {
				t.Fatalf("a ticket to the module console %q by hand: %v", name, err)
			}
		}
		if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: resB.ID}); !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
			t.Fatalf("a ticket with another tenant's reservation: %v", err)
		}
	})

	t.Run("an ended reservation takes its user, processes and home", func(t *testing.T) {
		tun, err := clB.Exec(ctx, api.OpenTunnel{Reservation: resB.ID, Command: []string{"sh", "-c", "echo started; exec sleep 300"}})
		if err != nil {
			t.Fatal(err)
		}
		defer tun.Close()
		r, w := io.Pipe()
		go func() { _, _ = tun.Wait(ctx, w, nil); w.Close() }()
		if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		u, err := user.Lookup(userB)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Reservations.Release(ctx, keyB, api.ReleaseReservation{Reservation: resB.ID}); err != nil {
			t.Fatal(err)
		}
		computetest.Eventually(t, e2eWait, "B's user gone", func() bool {
			_, err := user.Lookup(userB)
			return err != nil
		})
		if pids := uidProcesses(u.Uid); len(pids) > 0 {
			t.Fatalf("B's processes outlived its reservation: %v", pids)
		}
		if _, err := os.Stat(filepath.Join(home, userB)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("B's home outlived its reservation: %v", err)
		}
	})

	t.Run("a holder of the whole node runs as root", func(t *testing.T) {
		if _, err := a.Reservations.Release(ctx, keyA, api.ReleaseReservation{Reservation: resA.ID}); err != nil {
			t.Fatal(err)
		}
		var whole api.Reservation
		computetest.Eventually(t, e2eWait, "the whole node free", func() bool {
			whole, err = a.Reservations.Create(ctx, keyA, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 8}})
			return err == nil
		})
		users = append(users, api.ReservationUser(whole.ID))
		ticket, err := a.Access.Exec(ctx, keyA, api.OpenTunnel{Reservation: whole.ID, Command: []string{"true"}})
		if err != nil || !ticket.Root {
			t.Fatalf("the ticket of a holder of the whole node: %+v, %v", ticket, err)
		}
		var out string
		computetest.Eventually(t, e2eWait, "the whole holder's root", func() bool {
			var e api.TunnelExit
			out, e = sh(clA, whole, "id -u")
			return e.ExitCode == 0
		})
		if strings.TrimSpace(out) != "0" {
			t.Fatalf("a holder of the whole node runs as %q", out)
		}
		if _, err := a.Access.Console(ctx, keyA, api.OpenTunnel{Reservation: whole.ID}); err != nil {
			t.Fatalf("a whole holder's ticket to the node's console: %v", err)
		}
		// Another tenant comes (a vCPU): the whole holder's root command ends with its root.
		tun, err := clA.Exec(ctx, api.OpenTunnel{Reservation: whole.ID, Command: []string{"sh", "-c", "echo started; exec sleep 300"}})
		if err != nil {
			t.Fatal(err)
		}
		defer tun.Close()
		r, w := io.Pipe()
		exited := make(chan api.TunnelExit, 1)
		go func() { e, _ := tun.Wait(ctx, w, nil); w.Close(); exited <- e }()
		if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, r)
		vcpu, err := a.Reservations.Create(ctx, keyB, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{VCPUs: 1}})
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, api.ReservationUser(vcpu.ID))
		select {
		case e := <-exited:
			if e.ExitCode != -1 || !strings.Contains(e.Error, "ended") {
				t.Fatalf("the root command once another reservation came: %+v", e)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the whole holder's root command outlived its whole hold")
		}
	})
}

// uidProcesses lists the processes whose real uid is uid.
func uidProcesses(uid string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for l := range strings.Lines(string(b)) {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == uid {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// findCgroup2 says where cgroup v2 is mounted, or "".
func findCgroup2() string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for l := range strings.Lines(string(b)) {
		f := strings.Fields(l)
		if i := slices.Index(f, "-"); i > 4 && i+1 < len(f) && f[i+1] == "cgroup2" && f[3] == "/" {
			return f[4]
		}
	}
	return ""
}
