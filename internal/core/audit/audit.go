// Package audit makes the event log tamper-evident: its events are the leaves of an append-only
// Merkle tree (RFC 6962), whose checkpoints (size, root, time) a publisher signs with a key
// derived from the secret, and proofs of inclusion and consistency are computed from the live
// rows of compute.events, so that a row edited, deleted or reordered in SQL after a checkpoint
// covered it no longer proves against that checkpoint. docs/events.md ("Audit") describes it.
package audit

import (
	"context"
	"embed"
	"errors"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// Migrations is the audit tree's schema: its checkpoints.
var Migrations = postgres.EmbeddedMigrations("audit", "compute", migrationsFS)

// Module owns the audit tree: its checkpoints, their publisher and the audit methods.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "audit" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(Migrations)
	r.ResourceTypes(iam.ResourceType{Name: api.ResourceAudit, Description: "The event log's audit tree: signed checkpoints and proofs, over every tenant's events."})
	r.Actions(modules.ActionsFor(api.AuditMethods()...)...)
	r.Worker(modules.Worker{Name: "audit-checkpoint", Modes: []string{"worker"}, Run: publish})
	modules.Handle(r, api.AuditCheckpoint, nil, func(ctx context.Context, c *modules.Call, _ api.GetCheckpoint) (api.Checkpoint, error) {
		if err := rootOnly(c); err != nil {
			return api.Checkpoint{}, err
		}
		cp, err := Latest(ctx, c.Tx)
		if errors.Is(err, ErrNoCheckpoint) {
			return api.Checkpoint{}, api.Errorf(api.CodeFailedPrecondition, "no checkpoint has been published yet: the audit-checkpoint worker publishes one within %s of the first event", CheckpointEvery).
				With("reason", "no_checkpoint")
		}
		return cp, err
	})
	modules.Handle(r, api.AuditProveInclusion, nil, func(ctx context.Context, c *modules.Call, in api.ProveInclusion) (api.InclusionProof, error) {
		if err := rootOnly(c); err != nil {
			return api.InclusionProof{}, err
		}
		size, err := sizeOr(ctx, c, in.Size)
		if err != nil {
			return api.InclusionProof{}, err
		}
		if in.Seq > size {
			return api.InclusionProof{}, api.InvalidField("seq", "event %d is not in the tree of %d events (the latest checkpoint's)", in.Seq, size)
		}
		leaf, path, err := Inclusion(ctx, c.Tx, uint64(in.Seq), uint64(size))
		if err != nil {
			return api.InclusionProof{}, logError(err)
		}
		return api.InclusionProof{Seq: in.Seq, Size: size, LeafIndex: in.Seq - 1, Leaf: leaf, LeafHash: LeafHash(leaf), Hashes: path}, nil
	})
	modules.Handle(r, api.AuditProveConsistency, nil, func(ctx context.Context, c *modules.Call, in api.ProveConsistency) (api.ConsistencyProof, error) {
		if err := rootOnly(c); err != nil {
			return api.ConsistencyProof{}, err
		}
		to, err := sizeOr(ctx, c, in.To)
		if err != nil {
			return api.ConsistencyProof{}, err
		}
		if in.From > to {
			return api.ConsistencyProof{}, api.InvalidField("from", "%d is past the latest checkpoint's size %d", in.From, to)
		}
		p, err := Consistency(ctx, c.Tx, uint64(in.From), uint64(to))
		if err != nil {
			return api.ConsistencyProof{}, logError(err)
		}
		return api.ConsistencyProof{From: in.From, To: to, Hashes: p}, nil
	})
	return nil
}

// rootOnly refuses callers outside the root tenant: the tree spans every tenant's events, and
// its leaves carry them.
func rootOnly(c *modules.Call) error {
	if len(c.Target.TenantPath) == 1 && c.Target.TenantPath[0] == c.Target.TenantID {
		return nil
	}
	return api.Errorf(api.CodePermissionDenied, "the audit tree spans every tenant's events: only callers in the root tenant may use it").
		With("reason", "root_tenant_only")
}

// sizeOr is size, or the latest checkpoint's when it is 0.
func sizeOr(ctx context.Context, c *modules.Call, size int64) (int64, error) {
	if size != 0 {
		return size, nil
	}
	cp, err := Latest(ctx, c.Tx)
	if errors.Is(err, ErrNoCheckpoint) {
		return 0, api.Errorf(api.CodeFailedPrecondition, "no checkpoint has been published yet: name a tree size").With("reason", "no_checkpoint")
	}
	return cp.Size, err
}

// logError is the API's answer when the live log cannot give a proof: a gap or a size past its
// end is failed_precondition, which audit verify reports as the log not matching.
func logError(err error) error {
	switch {
	case errors.Is(err, ErrGap):
		return api.Errorf(api.CodeFailedPrecondition, "%s", err.Error()).With("reason", "log_gap")
	case errors.Is(err, ErrShort):
		return api.Errorf(api.CodeFailedPrecondition, "%s", err.Error()).With("reason", "log_short")
	}
	return err
}

// publish is the audit-checkpoint worker: every CheckpointEvery, a checkpoint of the events
// sequenced since the last (several in a row while a backlog lasts).
func publish(ctx context.Context, rt *modules.Runtime) error {
	k, err := NewKey(rt.Secret)
	if err != nil {
		return err
	}
	return modules.Every(ctx, CheckpointEvery, func() error {
		for {
			cp, more, err := Publish(ctx, rt.DB, k)
			if errors.Is(err, ErrGap) {
				rt.Logger.ErrorContext(ctx, "audit: the event log has a gap; no checkpoint is published past it", "error", err)
			}
			if err != nil || !more {
				return err
			}
			if cp != nil {
				rt.Logger.DebugContext(ctx, "audit: published a checkpoint; more events wait", "size", cp.Size)
			}
		}
	})
}
