package compat

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// proc is a process a test started: a bcd node, a control plane.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

// start runs bin with args until the test ends (or stop).
func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.kill)
	return p
}

// kill ends the process at once.
func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// stop ends the process as an operator would (SIGTERM), and waits for it.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the process did not stop within 30s of SIGTERM")
	}
}
