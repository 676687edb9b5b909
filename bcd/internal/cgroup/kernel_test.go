//go:build linux

package cgroup_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/compute/bcd/internal/cgroup"
)

// writableCgroup2 finds a cgroup2 hierarchy, mounted at its root, whose root offers the cpuset
// and memory controllers and in which this process may make cgroups; else it says why not.
func writableCgroup2() (string, string) {
	if os.Geteuid() != 0 {
		return "", "not root: making a cgroup and moving a process into it needs root"
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", "no /proc/self/mountinfo: " + err.Error()
	}
	defer f.Close()
	var why []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" || len(fields) < 5 {
			continue
		}
		root, mnt := fields[3], fields[4]
		if root != "/" {
			why = append(why, "the cgroup2 at "+mnt+" is mounted from "+root+", not its root")
			continue
		}
		b, err := os.ReadFile(filepath.Join(mnt, "cgroup.controllers"))
		ctls := strings.Fields(string(b))
		if err != nil || !slices.Contains(ctls, "cpuset") || !slices.Contains(ctls, "memory") {
			why = append(why, "the cgroup2 at "+mnt+" offers "+strconv.Quote(strings.Join(ctls, " "))+", not cpuset and memory (cgroup v1 holds them)")
			continue
		}
		return mnt, ""
	}
	if len(why) == 0 {
		return "", "no cgroup2 file system is mounted"
	}
	return "", strings.Join(why, "; ")
}

// TestApplyOnTheKernel enforces limits on a real process in a real cgroup2 hierarchy, and
// checks that the kernel holds the process to them. It runs only where a cgroup2 with the
// cpuset and memory controllers is writable; elsewhere (cgroup v1, the hybrid layout, not
// root) it skips, saying why.
func TestApplyOnTheKernel(t *testing.T) {
	root, why := writableCgroup2()
	if root == "" {
		t.Skip("no writable cgroup2 with cpuset and memory: " + why)
	}
	sub, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	for _, ctl := range []string{"cpuset", "memory"} {
		if !slices.Contains(strings.Fields(string(sub)), ctl) {
			if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+"+ctl), 0); err != nil {
				t.Skipf("cannot enable %s for %s's children: %v", ctl, root, err)
			}
		}
	}
	dir, err := os.MkdirTemp(root, "bcd-test-")
	if err != nil {
		t.Skipf("cannot make a cgroup under %s: %v", root, err)
	}
	defer os.Remove(dir)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	cpus, err := os.ReadFile(filepath.Join(root, "cpuset.cpus.effective"))
	if err != nil {
		t.Fatal(err)
	}
	all, err := cgroup.ParseCPUs(strings.TrimSpace(string(cpus)))
	if err != nil {
		t.Fatal(err)
	}
	one := strconv.Itoa(all[len(all)-1])
	got, err := cgroup.Tree{Root: root}.Apply(cmd.Process.Pid, cgroup.Limits{CPUs: one, MemoryGiB: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got.Cgroup != "/"+filepath.Base(dir) || got.MemoryMax != 1<<30 {
		t.Fatalf("applied %+v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "memory.max")); strings.TrimSpace(string(b)) != "1073741824" {
		t.Fatalf("memory.max %q", b)
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")
	if err != nil || !strings.Contains(string(status), "Cpus_allowed_list:\t"+one+"\n") {
		t.Fatalf("the kernel does not hold the process to CPU %s: %v\n%s", one, err, status)
	}
}
