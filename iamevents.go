package compute

import (
	"context"
	"time"

	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
)

// iamEventInterval is how often an API process asks IAM for new events: the most a revocation
// made elsewhere outlives the caches.
const iamEventInterval = time.Second

// iamEvents keeps an API process's caches honest: it follows IAM's event feed and drops what a
// revoked key or token or a deleted tenant makes stale, in the decision cache and in the port's
// own caches. It owns no table.
type iamEvents struct{ cache *iam.DecisionCache }

func (iamEvents) Name() string { return "iam-events" }

func (m iamEvents) Register(r *modules.Registry) error {
	r.Worker(modules.Worker{Name: "iam-events", Modes: []string{string(ModeAPI)}, Run: m.follow})
	return nil
}

func (m iamEvents) follow(ctx context.Context, rt *modules.Runtime) error {
	port, _ := rt.IAM.(iam.Invalidator)
	invalidate := func(e iam.Event) {
		// The port's caches first: a decision made between the two from the port's stale
		// policies would otherwise be cached again after the decision cache was cleared.
		if port != nil {
			port.Invalidate(e)
		}
		m.cache.Invalidate(e)
	}
	// Events from before this start (or a restart after a failure) were not seen: forget all,
	// after reading where the feed ends, so that an event written meanwhile is still followed.
	_, cursor, err := rt.IAM.Events(ctx, -1, 0)
	if err != nil {
		return err
	}
	invalidate(iam.Event{Type: iam.EventTenantDeleted})
	return iam.FollowFrom(ctx, rt.IAM, cursor, iamEventInterval, invalidate)
}
