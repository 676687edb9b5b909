package tenancy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/compute/bcd/internal/cdi"
)

// Every GPU device node of the node (nvidia0…, and the MIG capability nodes under
// nvidia-caps/) is root's and its own group's, mode 0660; the group's members are the users of
// the holds whose CDI spec names the node. The control nodes every CUDA process needs
// (nvidiactl, nvidia-uvm…) are left as they are: they open no GPU by themselves.

// deviceGlobs are the device nodes that open a GPU or a part of one, under the device root.
var deviceGlobs = []string{"nvidia[0-9]*", "nvidia-caps/nvidia-cap[0-9]*"}

var groupRE = regexp.MustCompile(`[^a-z0-9-]`)

// deviceGroup is the group of a device node: bc-dev-<its name>.
func deviceGroup(node string) string {
	name := groupRE.ReplaceAllString(strings.ToLower(filepath.Base(node)), "-")
	return "bc-dev-" + name[:min(len(name), 25)]
}

// specNodes reads a hold's CDI spec: its device nodes (those of its devices, not the shared
// control nodes) and its devices' environment. A hold without a spec has none.
func (m *Manager) specNodes(res string) (nodes, env []string) {
	b, err := os.ReadFile(filepath.Join(m.opts.CDIDir, cdi.SpecName(res)))
	if err != nil {
		return nil, nil
	}
	var s cdi.Spec
	if json.Unmarshal(b, &s) != nil {
		return nil, nil
	}
	root := filepath.Clean(m.opts.DeviceRoot) + string(filepath.Separator)
	for _, d := range s.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			if p := filepath.Clean(n.Path); strings.HasPrefix(p, root) {
				nodes = append(nodes, p)
			}
		}
		env = append(env, d.ContainerEdits.Env...)
	}
	return nodes, env
}

// devices converges the device nodes' groups, members and modes, and each holder's groups and
// devices' environment.
func (m *Manager) devices(ctx context.Context) error {
	members := map[string][]string{} // device node → the users that hold it
	for _, pattern := range deviceGlobs {
		found, _ := filepath.Glob(filepath.Join(m.opts.DeviceRoot, pattern))
		for _, p := range found {
			members[filepath.Clean(p)] = nil
		}
	}
	holdersOf := map[string][]string{} // user → its device nodes
	for res, h := range m.state.Users {
		nodes, env := m.specNodes(res)
		h.Env = env
		for _, n := range nodes {
			members[n] = append(members[n], h.User)
		}
		holdersOf[h.User] = nodes
	}
	groups, err := readGroups()
	if err != nil {
		return err
	}
	var errs []error
	gids := map[string]uint32{}
	for _, node := range slices.Sorted(maps.Keys(members)) {
		fi, err := os.Lstat(node)
		if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			continue // not a character device: not a GPU's node, never chowned
		}
		name := deviceGroup(node)
		want := slices.Clone(members[node])
		slices.Sort(want)
		want = slices.Compact(want)
		g, ok := groups[name]
		// A holder that leaves the device leaves its group for good: the group is made again
		// with a gid never given before, so a setgid file of the old one opens nothing, and
		// whatever still holds the device open without being one of its holders is killed (a
		// descriptor passed to another process).
		left := ok && slices.ContainsFunc(m.state.Members[name], func(u string) bool { return !slices.Contains(want, u) })
		if left {
			if err := run(ctx, "groupdel", name); err != nil {
				errs = append(errs, err)
				continue
			}
			ok = false
		}
		if !ok {
			id, err := m.freshID()
			if err != nil {
				return err
			}
			if err := run(ctx, "groupadd", "--gid", strconv.Itoa(id), name); err != nil {
				errs = append(errs, err)
				continue
			}
			if !slices.Contains(m.state.Groups, name) {
				m.state.Groups = append(m.state.Groups, name)
			}
			if groups, err = readGroups(); err != nil {
				return err
			}
			g = groups[name]
		}
		if !slices.Equal(want, g.members) {
			if err := run(ctx, "gpasswd", "-M", strings.Join(want, ","), name); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err := os.Chown(node, 0, int(g.gid)); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Chmod(node, 0o660); err != nil {
			errs = append(errs, err)
			continue
		}
		if left {
			m.killOpeners(node, want)
		}
		if m.state.Members == nil {
			m.state.Members = map[string][]string{}
		}
		m.state.Members[name] = want
		gids[node] = g.gid
	}
	for _, h := range m.state.Users {
		h.Groups = nil
		for _, n := range holdersOf[h.User] {
			if gid, ok := gids[n]; ok && !slices.Contains(h.Groups, gid) {
				h.Groups = append(h.Groups, gid)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("tenancy: the GPUs' device nodes: %w", errors.Join(errs...))
	}
	return nil
}

type group struct {
	gid     uint32
	members []string // sorted
}

// readGroups reads /etc/group: each group's gid and members.
func readGroups() (map[string]group, error) {
	f, err := os.Open("/etc/group")
	if err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	defer f.Close()
	out := map[string]group{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), ":")
		if len(parts) != 4 {
			continue
		}
		gid, err := strconv.ParseUint(parts[2], 10, 32)
		if err != nil {
			continue
		}
		var mem []string
		if parts[3] != "" {
			mem = strings.Split(parts[3], ",")
		}
		slices.Sort(mem)
		out[parts[0]] = group{gid: uint32(gid), members: mem}
	}
	return out, sc.Err()
}

// killOpeners kills the processes that hold node open and are not root's nor one of users'.
func (m *Manager) killOpeners(node string, users []string) {
	allowed := map[int]bool{0: true}
	for _, h := range m.state.Users {
		if slices.Contains(users, h.User) {
			allowed[h.UID] = true
		}
	}
	for round := 0; round < 100; round++ {
		pids := openersOf(node, allowed)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			m.log.Warn("tenancy: killed a process holding a GPU it does not hold", "pid", pid, "device", node)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openersOf lists the processes with a descriptor of node open whose real uid is not allowed.
func openersOf(node string, allowed map[int]bool) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name()), &st) != nil || allowed[int(st.Uid)] {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); err == nil && target == node {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}
