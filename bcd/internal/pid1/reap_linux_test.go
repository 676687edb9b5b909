//go:build linux

package pid1

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReapOnSIGCHLD: init reaps when a child exits (SIGCHLD).
func TestReapOnSIGCHLD(t *testing.T) {
	t.Parallel()
	f := newFake()
	r := start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	before := f.Reaped()
	if err := syscall.Kill(os.Getpid(), syscall.SIGCHLD); err != nil {
		t.Fatal(err)
	}
	f.await(t, "a reap after SIGCHLD", func() bool { return f.Reaped() > before })
}

// TestLinuxReap: the machine's Reap collects an exited child nobody waited for (the zombie an
// orphan leaves PID 1), and says so. It touches only a child this test starts, and is not run
// in parallel: Reap collects any child of the process.
func TestLinuxReap(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := cmd.Process.Pid
	// Wait for the child to exit, leaving it a zombie for Reap (WNOWAIT).
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid: %v", err)
	}
	if reaped := Linux().Reap(); reaped < 1 {
		t.Fatalf("Reap collected %d children after one exited", reaped)
	}
	// The child is gone: waiting for it finds no such child.
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("wait4 of the reaped child = %v, want ECHILD", err)
	}
	_ = cmd.Process.Release()
}
