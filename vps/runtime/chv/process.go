package chv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The VMM processes. Each is started in a session of its own (setsid), with stdin on /dev/null
// and stdout and stderr appended to its log, and is never waited for by a goroutine: it does not
// die with bcd, and a new bcd finds it again by its API socket and its pid file. While bcd runs,
// it reaps the VMMs it started when it checks them (wait4 with WNOHANG); after a restart, init
// (or the service manager) reaps them.

// pollInterval is how often the runtime looks at a VMM it waits for.
const pollInterval = 20 * time.Millisecond

// vmmState is what the runtime found of a VM's VMM.
type vmmState int

const (
	vmmGone         vmmState = iota // no process
	vmmAnswering                    // a process that answers vmm.ping
	vmmUnresponsive                 // a process that does not answer
)

// probe finds the VM's VMM: its pid (from the pid file, checked against the process's command
// line) and whether its API answers.
func (r *Runtime) probe(ctx context.Context, v vmFiles) (int, vmmState) {
	pid := r.pidOf(v)
	c := r.client(v)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if p, err := c.ping(pctx); err == nil {
		if pid == 0 && p.PID > 0 {
			pid = int(p.PID)
		}
		return pid, vmmAnswering
	}
	if pid != 0 {
		return pid, vmmUnresponsive
	}
	return 0, vmmGone
}

// pidOf is the pid of the VM's VMM if it runs: the pid file's, when that process is alive and is
// a VMM of this VM's socket (a pid can be reused); else 0.
func (r *Runtime) pidOf(v vmFiles) int {
	data, err := os.ReadFile(v.pid)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte("\x00"+v.socket+"\x00")) {
		return 0
	}
	return pid
}

// alive reports whether pid is a live process; it reaps pid first if it is an exited child of
// this process.
func alive(pid int) bool {
	var ws syscall.WaitStatus
	if p, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); p == pid {
		return false
	}
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	// A zombie that is not ours still answers kill(0); its state says it is dead.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}

// spawn starts the VM's VMM and waits until its API answers.
func (r *Runtime) spawn(ctx context.Context, v vmFiles) (*client, error) {
	// A VMM that crashed leaves its socket behind; the new one would fail to bind it.
	if err := removeSocket(v.socket); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(v.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("chv: %s: %w", v.name, err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- bcd: starting %s for %s at %s\n", r.binary, v.name, time.Now().UTC().Format(time.RFC3339))
	args := append([]string{"--api-socket", v.socket}, r.opts.Args...)
	cmd := exec.Command(r.binary, args...) // not CommandContext: the VMM outlives the call
	cmd.Dir = v.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chv: starting %s for %s: %w", r.binary, v.name, err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	if err := os.WriteFile(v.pid, []byte(strconv.Itoa(pid)+"\n"), 0o640); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("chv: %s: %w", v.name, err)
	}

	c := r.client(v)
	ctx, cancel := context.WithTimeout(ctx, r.opts.StartTimeout)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := c.ping(pctx)
		pcancel()
		if err == nil {
			return c, nil
		}
		if !alive(pid) {
			return nil, fmt.Errorf("chv: %s exited as it started (%s ends with: %s)", r.binary, v.log, logTail(v.log))
		}
		select {
		case <-ctx.Done():
			_ = r.kill(context.WithoutCancel(ctx), pid)
			return nil, fmt.Errorf("chv: %s (pid %d) did not answer on %s within %v, killed: %w (%s ends with: %s)",
				r.binary, pid, v.socket, r.opts.StartTimeout, err, v.log, logTail(v.log))
		case <-time.After(pollInterval):
		}
	}
}

// kill ends a VMM with SIGTERM, then SIGKILL when it has not exited within StopTimeout.
func (r *Runtime) kill(ctx context.Context, pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("chv: killing pid %d: %w", pid, err)
	}
	if r.waitExit(ctx, pid, r.opts.StopTimeout) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("chv: killing pid %d: %w", pid, err)
	}
	if !r.waitExit(context.WithoutCancel(ctx), pid, 5*time.Second) {
		return fmt.Errorf("chv: pid %d is still there after SIGKILL", pid)
	}
	return nil
}

// waitExit waits up to d for pid to exit; it reports whether it did.
func (r *Runtime) waitExit(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollInterval):
		}
	}
	return true
}

// logTail is the last lines of a VMM's log, for errors.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return truncate(strings.Join(lines, " | "), 1000)
}
