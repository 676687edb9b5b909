package tenancy

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Confine implements nodeagent.Confiner: cmd runs as the reservation's user, with no group of
// root's (only its own and its GPUs'), in its home, with an environment of its own (nothing of
// bcd's), in its cgroup where there is one.
//
// It holds the Manager until started is called: an Apply that ends the hold meanwhile waits,
// and then finds the command among the user's processes and kills it. Were it not held, the
// command could start after the user's processes were killed and its user removed, and run on
// as that uid, with its GPUs' groups, past the hold.
func (m *Manager) Confine(reservation string, cmd *exec.Cmd) (started func(), err error) {
	m.mu.Lock()
	h := m.state.Users[reservation]
	if h == nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("reservation %s holds nothing on this node yet (its desired state has not reached it): try again in a moment", reservation)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(h.UID), Gid: uint32(h.GID), Groups: slices.Clone(h.Groups)}
	cmd.Dir = h.Home
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	cmd.Env = append([]string{"HOME=" + h.Home, "USER=" + h.User, "LOGNAME=" + h.User, "SHELL=" + shell,
		"PATH=/usr/local/bin:/usr/bin:/bin", "TERM=xterm-256color"}, h.Env...)
	for _, e := range h.Env {
		// CUDA reads its own variable, not the container runtimes'.
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok {
			cmd.Env = append(cmd.Env, "CUDA_VISIBLE_DEVICES="+v)
		}
	}
	started = m.mu.Unlock
	if m.cgroup != "" {
		// Started into its cgroup (clone3's CLONE_INTO_CGROUP): it never runs outside it.
		fd, err := syscall.Open(filepath.Join(m.cgroup, CgroupParent, h.User), syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("the cgroup of reservation %s: %w", reservation, err)
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
		started = func() { syscall.Close(fd); m.mu.Unlock() }
	}
	return started, nil
}

// HideProcesses remounts proc (/proc) with hidepid=2: a user sees, and reads, its own processes
// alone; root (bcd, sshd) sees all. It checks that the mount says so afterwards.
func HideProcesses(ctx context.Context, proc string) error {
	if err := run(ctx, "mount", "-o", "remount,hidepid=2", proc); err != nil {
		return fmt.Errorf("tenancy: hide processes from other users: %w", err)
	}
	if !hidden(proc) {
		return fmt.Errorf("tenancy: %s does not say hidepid=2 after it was remounted so", proc)
	}
	return nil
}

// hidden reports whether proc is mounted with hidepid=2 (which newer kernels call invisible).
func hidden(proc string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	found := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+3 >= len(fields) || fields[4] != proc || fields[sep+1] != "proc" {
			continue
		}
		// The last mount at the point wins.
		opts := strings.Split(fields[sep+3], ",")
		found = slices.Contains(opts, "hidepid=2") || slices.Contains(opts, "hidepid=invisible")
	}
	return found
}
