package app

import (
	"context"
	"log/slog"
	"os"

	"github.com/better-compute/compute/bcd/internal/tenancy"
)

// tenants makes the confinement of holders of part of the node (bcd/internal/tenancy) when the
// node lets holders in (on, with --exec or --sshd-dir) and bcd runs as root; else nil, and the
// node lets in only a holder of the whole node or an operator (their commands as bcd's user,
// their SSH as --ssh-user): partial holders are refused, never given bcd's user.
func tenants(ctx context.Context, s *settings, logger *slog.Logger, on bool, helper, home, devRoot string, hidepid bool) (*tenancy.Manager, error) {
	if !on || s.CDIDir == "" {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		why := "bcd node runs unprivileged"
		if helper != "" {
			why += " (with the root helper, which makes no users)"
		}
		logger.Warn("bcd: "+why+": holders of part of this node get no commands and no SSH logins, only holders of the whole node and operators do",
			"docs", "docs/security.md")
		return nil, nil
	}
	m, err := tenancy.New(tenancy.Options{StateDir: s.StateDir, Home: home, DeviceRoot: devRoot, CDIDir: s.CDIDir, Logger: logger})
	if err != nil {
		return nil, err
	}
	if hidepid {
		if err := tenancy.HideProcesses(ctx, "/proc"); err != nil {
			// The holders' distinct users still keep each other's processes' memory, environment
			// and files unreadable; their command lines show.
			logger.Warn("bcd: holders may see each other's processes (not their memory or environment)", "error", err)
		}
	}
	return m, nil
}
