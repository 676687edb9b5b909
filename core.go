package compute

import (
	"context"
	"encoding/json"
	"time"

	"github.com/better-compute/compute/internal/envelope"
	"github.com/better-compute/compute/modules"
)

// coreModule registers what the envelope itself owns: the idempotency keys and their pruning.
type coreModule struct{}

func (coreModule) Name() string { return "core" }

func (coreModule) Register(r *modules.Registry) error {
	r.Migrations(envelope.Migrations)
	r.EventTypes(modules.EventType{Name: "action.confirmed", Description: "A call an agent's delegation reserves for its person was confirmed by them and made; its subject is the confirmation (data: method, action, resource, principal)."})
	r.Worker(modules.Worker{Name: "idempotency-prune", Modes: []string{string(ModeWorker)}, Run: pruneIdempotencyKeys})
	return nil
}

// pruneIdempotencyKeys deletes idempotency keys older than envelope.DefaultIdempotencyTTL, every
// ten minutes.
func pruneIdempotencyKeys(ctx context.Context, rt *modules.Runtime) error {
	return modules.Every(ctx, 10*time.Minute, func() error {
		n, err := envelope.PruneIdempotencyKeys(ctx, rt.DB.Pool, envelope.DefaultIdempotencyTTL)
		if n > 0 {
			rt.Logger.DebugContext(ctx, "compute: pruned idempotency keys", "count", n)
		}
		return err
	})
}

func decodeReplay(b []byte, out any) error { return json.Unmarshal(b, out) }
