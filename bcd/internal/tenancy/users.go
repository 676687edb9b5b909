package tenancy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cgroup"
)

// The system's own tools make and remove users and groups (shadow's useradd and the rest):
// they lock /etc/passwd and /etc/group as every other writer does.
var tools = []string{"useradd", "userdel", "groupadd", "groupdel", "gpasswd"}

// lookTool finds a tool on PATH or in the sbin directories (a daemon's PATH may lack them).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed", name)
}

// run runs a tool, again while another writer holds the password files' lock.
func run(ctx context.Context, name string, args ...string) error {
	path, err := lookTool(name)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
		if err == nil {
			return nil
		}
		// shadow's tools exit 10 (E_PW_UPDATE/E_GRP_UPDATE) or say "lock" when /etc/passwd
		// or /etc/group is locked by another writer.
		if attempt < 20 && bytes.Contains(out, []byte("lock")) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

// ensure makes a reservation's user, home and cgroup, if they are not there.
func (m *Manager) ensure(ctx context.Context, res string, hold *agentv1.DeviceHold) error {
	h := m.state.Users[res]
	if h == nil {
		name := userName(res)
		if _, err := user.Lookup(name); err == nil {
			// Not made here (or made and forgotten): never take over another's user.
			return fmt.Errorf("tenancy: the user %s of reservation %s exists and is not this bcd's: refusing to use it", name, res)
		}
		home := filepath.Join(m.opts.Home, name)
		shell := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			shell = "/bin/bash"
		}
		if err := os.MkdirAll(m.opts.Home, 0o755); err != nil {
			return fmt.Errorf("tenancy: %w", err)
		}
		// The password "*" matches nothing and is not "locked" ("!"), which sshd would refuse
		// before any certificate is looked at.
		id, err := m.freshID()
		if err != nil {
			return err
		}
		if err := run(ctx, "groupadd", "--gid", strconv.Itoa(id), name); err != nil {
			return fmt.Errorf("tenancy: make the group of reservation %s: %w", res, err)
		}
		if err := run(ctx, "useradd", "--no-log-init", "--uid", strconv.Itoa(id), "--gid", strconv.Itoa(id), "--no-create-home", "--home-dir", home, "--shell", shell,
			"--password", "*", "--comment", "better-compute reservation "+res, name); err != nil {
			return fmt.Errorf("tenancy: make the user of reservation %s: %w", res, err)
		}
		u, err := user.Lookup(name)
		if err != nil {
			return fmt.Errorf("tenancy: the user %s just made: %w", name, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		h = &holder{User: name, UID: uid, GID: gid, Home: home}
		m.state.Users[res] = h
		if err := m.save(); err != nil {
			return err
		}
		m.log.Info("tenancy: made the user of a reservation", "reservation", res, "user", name, "uid", uid)
	}
	if err := os.Mkdir(h.Home, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("tenancy: home of %s: %w", h.User, err)
	}
	if err := os.Lchown(h.Home, h.UID, h.GID); err != nil {
		return fmt.Errorf("tenancy: home of %s: %w", h.User, err)
	}
	if err := os.Chmod(h.Home, 0o700); err != nil {
		return fmt.Errorf("tenancy: home of %s: %w", h.User, err)
	}
	if m.cgroup != "" {
		m.ensureCgroup(h, hold)
	}
	return nil
}

// cgroupOf is a holder's cgroup, relative to the cgroup2 mount.
func cgroupOf(h *holder) string { return "/" + CgroupParent + "/" + h.User }

// ensureCgroup makes the holder's cgroup and applies the hold's cpuset and memory where the
// controllers are there to. What cannot be applied is logged, not refused: the commands still
// run as the holder's user, in its cgroup.
func (m *Manager) ensureCgroup(h *holder, hold *agentv1.DeviceHold) {
	parent := filepath.Join(m.cgroup, CgroupParent)
	if err := os.MkdirAll(filepath.Join(parent, h.User), 0o755); err != nil {
		m.log.Warn("tenancy: make a holder's cgroup", "user", h.User, "error", err)
		return
	}
	limits := cgroup.Limits{CPUs: hold.GetCpuset(), MemoryGiB: int(hold.GetMemoryGib())}
	if limits.CPUs == "" && limits.MemoryGiB == 0 {
		return
	}
	// The controllers a child needs are enabled in its parents (best effort: cgroup v1 may own
	// them, which ApplyTo then says).
	for _, ctl := range []string{"+cpuset", "+memory"} {
		_ = os.WriteFile(filepath.Join(m.cgroup, "cgroup.subtree_control"), []byte(ctl), 0)
		_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte(ctl), 0)
	}
	if _, err := (cgroup.Tree{Root: m.cgroup}).ApplyTo(cgroupOf(h), limits); err != nil {
		m.log.Warn("tenancy: a hold's cpuset and memory are not enforced on its commands", "user", h.User, "error", err)
	}
}

// remove ends a reservation's confinement: its processes, cgroup, user, home and the files it
// left in the shared temporary directories.
func (m *Manager) remove(ctx context.Context, res string) error {
	h := m.state.Users[res]
	var errs []error
	if m.cgroup != "" {
		// cgroup.kill (Linux 5.14) ends every process of the cgroup at once, forks in flight too.
		_ = os.WriteFile(filepath.Join(m.cgroup, CgroupParent, h.User, "cgroup.kill"), []byte("1"), 0)
	}
	if h.UID > 0 { // never root's, whatever the state file says
		if err := killUser(h.UID); err != nil {
			errs = append(errs, err)
		}
	}
	if m.cgroup != "" {
		dir := filepath.Join(m.cgroup, CgroupParent, h.User)
		for i := 0; i < 50; i++ { // an emptied cgroup is removable once its last process is reaped
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if filepath.Dir(h.Home) == filepath.Clean(m.opts.Home) && filepath.Base(h.Home) == h.User {
		if err := os.RemoveAll(h.Home); err != nil {
			errs = append(errs, err)
		}
	}
	if h.UID > 0 {
		removeOwned(h.UID, "/tmp", "/var/tmp", "/dev/shm")
	}
	// The user last: once it is gone, so is everything of it.
	if _, err := user.Lookup(h.User); err == nil && len(errs) == 0 {
		if err := run(ctx, "userdel", h.User); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("tenancy: remove the confinement of reservation %s: %w", res, errors.Join(errs...))
	}
	delete(m.state.Users, res)
	m.log.Info("tenancy: removed the user of an ended reservation", "reservation", res, "user", h.User)
	return nil
}

// killUser kills every process of uid, over and over until none is left (a process may fork
// while the others die; it cannot leave its uid).
func killUser(uid int) error {
	for round := 0; round < 100; round++ {
		pids := processesOf(uid)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("processes of uid %d are still running after 100 rounds of SIGKILL", uid)
}

// processesOf lists the processes any of whose uids (real, effective, saved, file system) is uid.
func processesOf(uid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	want := strconv.Itoa(uid)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
				if slices.Contains(strings.Fields(rest), want) {
					out = append(out, pid)
				}
				break
			}
		}
		f.Close()
	}
	return out
}

// removeOwned removes what uid left at the top of the shared temporary directories, so that a
// later user given the same uid does not find it. (What it left deeper, in another's
// directory, stays: docs/security.md.)
func removeOwned(uid int, dirs ...string) {
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			p := filepath.Join(d, e.Name())
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil && int(st.Uid) == uid {
				_ = os.RemoveAll(p)
			}
		}
	}
}

// findCgroup2 finds where the cgroup2 file system is mounted at its root, or "".
func findCgroup2() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" || fields[3] != "/" {
			continue
		}
		return fields[4]
	}
	return ""
}
