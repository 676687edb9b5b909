package app

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/compute/bcd/internal/cgroup"
)

// cgroupHookCmd is the OCI hook that the CDI spec of a hold names (bcd/internal/cdi): a runtime
// runs it with the container's state on stdin, and it enforces the hold's cpuset and memory on
// the container's cgroup. It fails (and so the container does not start) when it cannot.
func cgroupHookCmd() *cobra.Command {
	var holder string
	var limits cgroup.Limits
	var tree cgroup.Tree
	c := &cobra.Command{
		Use:    "cgroup-hook --holder H [--cpuset LIST] [--memory-gib N]",
		Short:  "OCI hook: enforce a hold's cpuset and memory on the container's cgroup (cgroup v2)",
		Hidden: true, // run by container runtimes, from the CDI specs bcd writes
		Long: `cgroup-hook reads the OCI state of a container on stdin (the runtime writes it), finds the
cgroup v2 of its process (/proc/<pid>/cgroup) and writes cpuset.cpus (and cpuset.mems where the
cgroup has no memory nodes) and memory.max there. It refuses, exiting non-zero so that the container
does not start, on cgroup v1 or where the cpuset or memory controller is not enabled for the cgroup.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if holder == "" {
				return fmt.Errorf("cgroup-hook needs --holder")
			}
			state, err := cgroup.ReadState(cmd.InOrStdin())
			if err != nil {
				return fmt.Errorf("cgroup-hook: holder %s: %w", holder, err)
			}
			got, err := tree.Apply(state.Pid, limits)
			if err != nil {
				return fmt.Errorf("cgroup-hook: holder %s: container %s (pid %d): %w", holder, state.ID, state.Pid, err)
			}
			// A runtime keeps a hook's stderr in its logs: say what was enforced.
			fmt.Fprintf(cmd.ErrOrStderr(), "bcd cgroup-hook: holder %s: container %s (pid %d) in %s: cpuset.cpus=%q memory.max=%d\n",
				holder, state.ID, state.Pid, got.Cgroup, got.CPUs, got.MemoryMax)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&holder, "holder", "", "the holder (reservation) whose limits these are")
	f.StringVar(&limits.CPUs, "cpuset", "", "the CPUs the container may run on, a CPU list (0-7,16)")
	f.IntVar(&limits.MemoryGiB, "memory-gib", 0, "the container's memory limit in GiB")
	f.StringVar(&tree.Root, "cgroup-root", cgroup.DefaultRoot, "where the cgroup v2 hierarchy is mounted")
	f.StringVar(&tree.Proc, "proc", "/proc", "where /proc is")
	_ = f.MarkHidden("cgroup-root")
	_ = f.MarkHidden("proc")
	return c
}
