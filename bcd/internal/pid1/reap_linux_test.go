//go:build linux

package pid1

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReapOnSIGCHLD: init reaps when a child exits (SIGCHLD).
func TestReapOnSIGCHLD(t *testing.T) {
	f := newFake()
	r := start(t, f, Config{}, nil)
	r.waitRamdisk(t, 1)
	before := f.Reaped()
	if err := syscall.Kill(os.Getpid(), syscall.SIGCHLD); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a reap after SIGCHLD", func() bool { return f.Reaped() > before })
}

// TestLinuxReap: the machine's Reap collects an exited child nobody waited for (the zombie an
// orphan leaves PID 1), and says so. It touches only a child this test starts.
func TestLinuxReap(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := cmd.Process.Pid
	reaped := 0
	deadline := time.Now().Add(10 * time.Second)
	for reaped == 0 && time.Now().Before(deadline) {
		reaped = Linux().Reap()
		time.Sleep(5 * time.Millisecond)
	}
	if reaped == 0 {
		t.Fatal("Reap collected nothing after a child exited")
	}
	// The child is gone: waiting for it finds no such child.
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("wait4 of the reaped child = %v, want ECHILD", err)
	}
	_ = cmd.Process.Release()
}
