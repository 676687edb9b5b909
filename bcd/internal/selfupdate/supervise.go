package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Supervisor runs the current slot's binary (bcd node …) and runs it again when it exits, as a
// unit with Restart=always would, and it watches an update's trial from outside the new binary,
// which may not be able to watch itself: when the binary of a trial exits, or the trial's
// deadline (and Grace) passes before the binary ends it, the supervisor rolls back and runs the
// previous slot's binary. The node re-execs itself into a new slot in the same process, so the
// supervisor sees one child throughout.
type Supervisor struct {
	Slots Slots
	Self  string   // seeds slot a on the first run (this binary)
	Args  []string // the child's arguments, e.g. node --state-dir /var/lib/bcd
	// Grace is how long after a trial's deadline the supervisor acts: the binary's own check
	// acts first. Default 10s.
	Grace time.Duration
	// Backoff is the wait before running a binary again after it exited outside a trial.
	// Default 1s, doubled up to 30s.
	Backoff        time.Duration
	Stdout, Stderr io.Writer
	Logger         *slog.Logger
}

// Run supervises until ctx ends, then stops the child (SIGTERM, SIGKILL after 15 s).
func (s *Supervisor) Run(ctx context.Context) error {
	if s.Grace <= 0 {
		s.Grace = 10 * time.Second
	}
	if s.Backoff <= 0 {
		s.Backoff = time.Second
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	if err := s.Slots.Seed(s.Self); err != nil {
		return err
	}
	backoff := s.Backoff
	for ctx.Err() == nil {
		start := time.Now()
		rolled, err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if rolled {
			backoff = s.Backoff
			continue // the previous slot, at once
		}
		if time.Since(start) > time.Minute {
			backoff = s.Backoff
		}
		s.Logger.Warn("bcd supervise: the node exited; running it again", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
	return nil
}

// runOnce runs the current binary until it exits, ctx ends, or its trial fails; rolled says a
// trial was rolled back.
func (s *Supervisor) runOnce(ctx context.Context) (rolled bool, err error) {
	path := s.Slots.CurrentPath()
	cmd := exec.Command(path, s.Args...)
	cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
	if err := cmd.Start(); err != nil {
		if t, rerr := s.Slots.Rollback(fmt.Sprintf("it could not be started: %v", err)); rerr == nil && t != nil {
			s.Logger.Error("bcd supervise: the updated binary could not start; rolled back", "version", t.Version, "error", err)
			return true, err
		}
		return false, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			return false, nil
		case err := <-done:
			if t, rerr := s.Slots.Rollback(fmt.Sprintf("it exited during its trial (%v)", exitOf(err))); rerr != nil {
				return false, rerr
			} else if t != nil {
				s.Logger.Error("bcd supervise: the updated binary exited before reaching its gateway; rolled back", "version", t.Version, "to", t.PreviousVersion, "exit", exitOf(err))
				return true, err
			}
			return false, err
		case <-tick.C:
			t, err := s.Slots.Trial()
			if err != nil || t == nil || time.Now().Before(t.Deadline.Add(s.Grace)) {
				continue
			}
			_ = cmd.Process.Kill()
			<-done
			if t, err := s.Slots.Rollback(fmt.Sprintf("it did not reach its gateway within %s", t.Deadline.Sub(t.Started).Round(time.Second))); err != nil {
				return false, err
			} else if t != nil {
				s.Logger.Error("bcd supervise: the updated binary did not reach its gateway in time; rolled back", "version", t.Version, "to", t.PreviousVersion)
			}
			return true, nil
		}
	}
}

func exitOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ProcessState.String()
	}
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// Exec replaces the process with path, given this process's arguments and environment: the
// restart into another slot, in the same process (its supervisor or unit sees no exit).
func Exec(path string) error {
	args := append([]string{path}, os.Args[1:]...)
	return syscall.Exec(path, args, os.Environ())
}
