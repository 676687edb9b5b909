package nodeagent

import (
	"fmt"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// checkRenewed verifies a renewed certificate before it replaces the current one: it must be for
// the key made for the renewal, chain to the machine CA pinned at join, and be valid now. A
// gateway that is wrong or not ours cannot hand the node an identity it cannot use.
func checkRenewed(id Identity, key []byte, r *agentv1.Renewed) error {
	if err := CheckCertificate(key, r.GetCertificateDer(), id.CADER, time.Now()); err != nil {
		return fmt.Errorf("renewed certificate: %w", err)
	}
	return nil
}
