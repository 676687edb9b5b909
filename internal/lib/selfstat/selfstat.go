// Package selfstat reads what this process costs: CPU time and resident memory. The fleet
// simulator and the gateway benchmark report it.
package selfstat

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPU is the user and system CPU time this process has used.
func CPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RSSMiB is this process's resident memory in MiB, from /proc/self/status; 0 where there is none.
func RSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
