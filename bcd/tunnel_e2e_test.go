package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
)

// countWriter counts what is written to it.
type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// TestTunnelsRunCommandsAndConsolesOnARealNode: access.exec and access.console over a real bcd
// node's session, through the API's WebSocket and the Go client: output, errors and exit codes, a
// terminal and its size, flow control both ways (a holder that does not read, a command that
// does not read, neither stalls the session), one-use tickets, the tunnel ended with its
// reservation, the console, and the CLI.
func TestTunnelsRunCommandsAndConsolesOnARealNode(t *testing.T) {
	t.Parallel()
	prebuild("better-compute", "../cmd/better-compute") // for the cli subtest, while the rest runs
	e := newE2E(t, e2eOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, url, a, key := e.Bin, e.URL, e.API, e.RootKey

	// The node's console: a socket that answers each line it is sent.
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
			go func() {
				defer c.Close()
				io.WriteString(c, "serial console ready\r\n")
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					io.WriteString(c, "console> "+sc.Text()+"\r\n")
				}
			}()
		}
	}()

	if out, err := exec.Command(bin, "node", "--state-dir", t.TempDir(), "--console", "ttyS0=unix:relative.sock").CombinedOutput(); err == nil || !strings.Contains(string(out), "want name=unix:/absolute/path") {
		t.Fatalf("a relative console socket: %v\n%s", err, out)
	}
	e.node(nodeOptions{Name: "tun-node", Args: []string{"--exec", "--console", "=unix:" + sock, "--console", "vm=unix:" + filepath.Join(dir, "vm.sock"),
		"--home", filepath.Join(dir, "home"), "--proc-hidepid=false"}})
	// The whole node: its holder runs commands as bcd's user and may attach to the node's own
	// consoles (a holder of part of it is confined: tenancy_e2e_test.go).
	var res api.Reservation
	computetest.Eventually(t, e2eWait, "a reservation on the node", func() bool {
		res, err = a.Reservations.Create(ctx, key, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 8}})
		return err == nil
	})
	t.Cleanup(func() { _ = exec.Command("userdel", api.ReservationUser(res.ID)).Run() })
	cl, err := client.New(url, client.WithAPIKey(key))
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the node's session", func() bool {
		tun, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"true"}})
		if err != nil {
			return false
		}
		e, err := tun.Run(ctx, nil, io.Discard, nil)
		return err == nil && e.ExitCode == 0
	})
	run := func(in api.OpenTunnel, stdin string) (stdout, stderr string, e api.TunnelExit) {
		t.Helper()
		tun, err := cl.Exec(ctx, in)
		if err != nil {
			t.Fatalf("exec %v: %v", in.Command, err)
		}
		var o, eb bytes.Buffer
		var r io.Reader
		if stdin != "" {
			r = strings.NewReader(stdin)
		}
		if e, err = tun.Run(ctx, r, &o, &eb); err != nil {
			t.Fatalf("exec %v: %v", in.Command, err)
		}
		return o.String(), eb.String(), e
	}

	t.Run("exec", func(t *testing.T) {
		out, errOut, e := run(api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", "read x; echo out:$x; echo oops >&2; exit 7"}}, "hello\n")
		if out != "out:hello\n" || errOut != "oops\n" || e.ExitCode != 7 || e.Error != "" {
			t.Fatalf("stdout %q, stderr %q, exit %+v", out, errOut, e)
		}
		_, _, e = run(api.OpenTunnel{Reservation: res.ID, Command: []string{"/no/such/command"}}, "")
		if e.ExitCode != -1 || !strings.Contains(e.Error, "/no/such/command") {
			t.Fatalf("a command that does not exist: %+v", e)
		}
	})

	t.Run("tty", func(t *testing.T) {
		tun, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", "stty size; read x; stty size"}, TTY: true, Cols: 100, Rows: 30})
		if err != nil {
			t.Fatal(err)
		}
		r, w := io.Pipe()
		done := make(chan api.TunnelExit, 1)
		go func() {
			e, _ := tun.Wait(ctx, w, nil)
			w.Close()
			done <- e
		}()
		sc := bufio.NewScanner(r)
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "30 100" {
			t.Fatalf("the first size: %q", sc.Text())
		}
		if err := tun.Resize(ctx, 120, 40); err != nil {
			t.Fatal(err)
		}
		// The resize and the line travel in order (one WebSocket, one session), and the node
		// sizes the terminal as it reads the resize, before it queues the line for the command.
		tun.Write([]byte("\n"))
		var last string
		for sc.Scan() {
			if s := strings.TrimSpace(sc.Text()); s != "" {
				last = s
			}
		}
		if last != "40 120" {
			t.Fatalf("the size after the resize: %q", last)
		}
		if e := <-done; e.ExitCode != 0 {
			t.Fatalf("exit %+v", e)
		}
	})

	t.Run("flow control", func(t *testing.T) {
		// A holder that does not read: its command blocks on the window, the session goes on.
		stalled, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", "yes hello"}})
		if err != nil {
			t.Fatal(err)
		}
		// A command that does not read its input (until the test lets it end), sent more than
		// the window: the holder's writes wait, the session goes on.
		letGo := filepath.Join(t.TempDir(), "let-go")
		if err := syscall.Mkfifo(letGo, 0o600); err != nil {
			t.Fatal(err)
		}
		deaf, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", "read -r _ < " + letGo + "; echo done"}})
		if err != nil {
			t.Fatal(err)
		}
		windowSent, wrote := make(chan struct{}), make(chan error, 1)
		go func() {
			chunk, sent := bytes.Repeat([]byte("x"), 32<<10), 0
			for sent < 2<<20 {
				if _, err := deaf.Write(chunk); err != nil {
					wrote <- err
					return
				}
				if sent += len(chunk); sent == agentv1.TunnelWindow {
					close(windowSent)
				}
			}
			wrote <- nil
		}()
		<-windowSent
		if out, _, e := run(api.OpenTunnel{Reservation: res.ID, Command: []string{"echo", "alive"}}, ""); out != "alive\n" || e.ExitCode != 0 {
			t.Fatalf("beside stalled tunnels: %q %+v", out, e)
		}
		if err := os.WriteFile(letGo, []byte("go\n"), 0); err != nil {
			t.Fatal(err)
		}
		var o bytes.Buffer
		if e, err := deaf.Wait(ctx, &o, nil); err != nil || e.ExitCode != 0 || o.String() != "done\n" {
			t.Fatalf("the command that did not read: %q %+v %v", o.String(), e, err)
		}
		<-wrote
		// The holder reads at last: what yes wrote comes in order, and nothing was dropped.
		r, w := io.Pipe()
		go func() { _, _ = stalled.Wait(ctx, w, nil); w.Close() }()
		sc := bufio.NewScanner(r)
		for i := 0; i < 100000 && sc.Scan(); i++ {
			if sc.Text() != "hello" {
				t.Fatalf("line %d: %q", i, sc.Text())
			}
		}
		r.Close()
		stalled.Close()
		// Much output, read as fast as it comes: all of it.
		tun, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"head", "-c", "8000000", "/dev/zero"}})
		if err != nil {
			t.Fatal(err)
		}
		var n countWriter
		if e, err := tun.Run(ctx, nil, &n, nil); err != nil || e.ExitCode != 0 || n.n != 8000000 {
			t.Fatalf("8 MB of output: %d bytes, %+v, %v", n.n, e, err)
		}
	})

	t.Run("console", func(t *testing.T) {
		tun, err := cl.Console(ctx, api.OpenTunnel{Reservation: res.ID})
		if err != nil {
			t.Fatal(err)
		}
		r, w := io.Pipe()
		go func() { _, _ = tun.Wait(ctx, w, nil); w.Close() }()
		sc := bufio.NewScanner(r)
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "serial console ready" {
			t.Fatalf("the console's banner: %q", sc.Text())
		}
		tun.Write([]byte("uname\n"))
		if !sc.Scan() || strings.TrimSpace(sc.Text()) != "console> uname" {
			t.Fatalf("the console's answer: %q", sc.Text())
		}
		tun.Close()
		other, err := cl.Console(ctx, api.OpenTunnel{Reservation: res.ID, Console: "ttyS9"})
		if err != nil {
			t.Fatal(err)
		}
		if e, _ := other.Wait(ctx, io.Discard, nil); e.ExitCode != -1 || !strings.Contains(e.Error, `no console "ttyS9"`) {
			t.Fatalf("a console the node does not have: %+v", e)
		}
	})

	t.Run("vm serial console", func(t *testing.T) {
		kernels, _ := filepath.Glob("/boot/vmlinuz-*")
		qemu, err := exec.LookPath("qemu-system-x86_64")
		if len(kernels) == 0 || err != nil {
			t.Skip("needs qemu-system-x86 and linux-image-amd64 (Debian packages; .ci/run installs them)")
		}
		// A VM whose serial port is a socket, as a VM host's are: QEMU waits for the console to
		// attach before it starts, so everything the kernel prints comes through the tunnel.
		vm := exec.Command(qemu, "-nodefaults", "-display", "none", "-no-reboot", "-m", "256", "-accel", "tcg",
			"-chardev", "socket,id=s0,path="+filepath.Join(dir, "vm.sock")+",server=on,wait=on", "-serial", "chardev:s0",
			"-kernel", kernels[len(kernels)-1], "-append", "console=ttyS0 panic=-1")
		var vmLog bytes.Buffer
		vm.Stdout, vm.Stderr = &vmLog, &vmLog
		if err := vm.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = vm.Process.Kill(); _ = vm.Wait() }()
		var tun *client.Tunnel
		computetest.Eventually(t, e2eWait, "the VM's console", func() bool {
			tun, err = cl.Console(ctx, api.OpenTunnel{Reservation: res.ID, Console: "vm"})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			e, err := tun.Wait(ctx, &out, nil)
			if strings.Contains(e.Error, "connect: no such file") || strings.Contains(e.Error, "connection refused") {
				return false // QEMU has not made its socket yet
			}
			// The kernel boots with no root file system, panics and QEMU exits: the tunnel carried
			// the whole boot.
			if err != nil || !strings.Contains(out.String(), "Linux version") || !strings.Contains(out.String(), "Kernel panic") {
				t.Fatalf("the VM's console: %v, exit %+v, output:\n%s\nqemu: %s", err, e, out.String(), vmLog.String())
			}
			return true
		})
	})

	t.Run("tickets", func(t *testing.T) {
		ticket, err := a.Access.Exec(ctx, key, api.OpenTunnel{Reservation: res.ID, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		tun, err := cl.OpenTunnel(ctx, ticket)
		if err != nil {
			t.Fatal(err)
		}
		tun.Run(ctx, nil, io.Discard, nil)
		var ae *api.Error
		if _, err := cl.OpenTunnel(ctx, ticket); !errors.As(err, &ae) || ae.Code != api.CodeUnauthenticated {
			t.Fatalf("a ticket used twice: %v", err)
		}
		late, err := a.Access.Exec(ctx, key, api.OpenTunnel{Reservation: res.ID, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.DB.Pool.Exec(ctx, `UPDATE compute.access_tickets SET expires_at = now() - interval '1 second' WHERE used_at IS NULL`); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.OpenTunnel(ctx, late); !errors.As(err, &ae) || ae.Code != api.CodeUnauthenticated {
			t.Fatalf("an expired ticket: %v", err)
		}
		forged := ticket
		forged.URL = api.BasePath + api.TunnelPath + "?ticket=" + "bctun_AAAA"
		if _, err := cl.OpenTunnel(ctx, forged); !errors.As(err, &ae) || ae.Code != api.CodeUnauthenticated {
			t.Fatalf("a made-up ticket: %v", err)
		}
		if _, err := a.Access.Exec(ctx, key, api.OpenTunnel{Reservation: res.ID}); !errors.As(err, &ae) || ae.Code != api.CodeInvalidArgument {
			t.Fatalf("exec without a command: %v", err)
		}
		if n := computetest.Count(t, e.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'access.exec' AND data->>'reservation' = $1`, res.ID); n < 5 {
			t.Fatalf("%d access.exec events", n)
		}
	})

	t.Run("cli", func(t *testing.T) {
		cli := goBuild(t, "better-compute", "../cmd/better-compute")
		cmd := exec.Command(cli, "--url", url, "--api-key", key, "exec", "--reservation", res.ID, "--", "sh", "-c", "cat; echo to-stderr >&2; exit 3")
		cmd.Stdin = strings.NewReader("from stdin\n")
		var o, eb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &eb
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 || o.String() != "from stdin\n" || eb.String() != "to-stderr\n" {
			t.Fatalf("better-compute exec: %v, stdout %q, stderr %q", err, o.String(), eb.String())
		}
	})

	// Last: the reservation ends, and its tunnel with it.
	t.Run("reservation ends", func(t *testing.T) {
		tun, err := cl.Exec(ctx, api.OpenTunnel{Reservation: res.ID, Command: []string{"sh", "-c", "echo started; exec sleep 600"}})
		if err != nil {
			t.Fatal(err)
		}
		r, w := io.Pipe()
		exited := make(chan api.TunnelExit, 1)
		lost := make(chan error, 1)
		go func() {
			e, err := tun.Wait(ctx, w, nil)
			w.Close()
			exited <- e
			lost <- err
		}()
		if line, err := bufio.NewReader(r).ReadString('\n'); err != nil || line != "started\n" {
			t.Fatalf("the command's first line: %q, %v", line, err)
		}
		go io.Copy(io.Discard, r)
		if _, err := a.Reservations.Release(ctx, key, api.ReleaseReservation{Reservation: res.ID}); err != nil {
			t.Fatal(err)
		}
		if e, err := <-exited, <-lost; err != nil || e.ExitCode != -1 || !strings.Contains(e.Error, "no longer holds") {
			t.Fatalf("the tunnel after the reservation ended: %+v, %v", e, err)
		}
		var ae *api.Error
		if _, err := a.Access.Exec(ctx, key, api.OpenTunnel{Reservation: res.ID, Command: []string{"true"}}); !errors.As(err, &ae) || ae.Code != api.CodeFailedPrecondition {
			t.Fatalf("exec as an ended reservation: %v", err)
		}
	})
}
