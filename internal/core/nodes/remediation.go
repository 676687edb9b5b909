package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/workflow"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/provision"
)

// XIDRemediation is the workflow a critical XID (or an ECC error) starts for its GPU: cordon the
// node, wait for the GPU's holders to finish (up to the drain deadline), reset it, check that it
// came back healthy, and uncordon the node if this run cordoned it. A run that cannot finish
// (the drain deadline passes, the reset fails, the GPU stays unhealthy) fails, leaving the node
// cordoned for an operator: its workflow.failed event is the escalation.
const XIDRemediation = "node.xid-remediation"

// Remediation's bounds.
const (
	// RemediationDrainDeadline is how long the drain step waits for a GPU's holders.
	RemediationDrainDeadline = 4 * time.Hour
	// RemediationVerifyDeadline is how long the reset may take to show a healthy GPU.
	RemediationVerifyDeadline = 10 * time.Minute
	// remediationPoll is how often a waiting step looks again.
	remediationPoll = time.Second
	// remediationTimeout bounds an attempt of a step: each is one short transaction.
	remediationTimeout = 5 * time.Second
)

// remediationInput is a run's input.
type remediationInput struct {
	GPU    int    `json:"gpu"`
	Reason string `json:"reason"` // e.g. "xid 79"
}

// StartRemediation starts the remediation of GPU index of node, in tx, unless one of that GPU is
// running already. It reports whether it started one.
func StartRemediation(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, tenant, node string, index int, reason string) (bool, error) {
	running, err := workflow.Running(ctx, tx, XIDRemediation, node, map[string]any{"gpu": index})
	if err != nil || running {
		return false, err
	}
	_, err = rt.Workflows.Start(ctx, tx, provision.StartWorkflow{Workflow: XIDRemediation, TenantID: tenant, Subject: node,
		Input: remediationInput{GPU: index, Reason: reason}, CreatedBy: "system:remediation"})
	return err == nil, err
}

func registerRemediation(r *modules.Registry) {
	r.Workflow(provision.Workflow[*modules.Runtime]{Name: XIDRemediation, Steps: []provision.Step[*modules.Runtime]{
		{Name: "cordon", Timeout: remediationTimeout, Run: remediationStep(cordonForRemediation)},
		{Name: "drain", Timeout: remediationTimeout, Deadline: RemediationDrainDeadline, Run: remediationStep(drainGPU)},
		{Name: "reset", Timeout: remediationTimeout, Run: remediationStep(resetGPU)},
		{Name: "verify", Timeout: remediationTimeout, Deadline: RemediationVerifyDeadline, Run: remediationStep(verifyGPU)},
		{Name: "uncordon", Timeout: remediationTimeout, Run: remediationStep(uncordonAfterRemediation)},
	}})
}

// remediationStep runs fn in a transaction of its own, as the run's system principal acting in
// the node's tenant: what it changes commits with nothing else.
func remediationStep(fn func(ctx context.Context, c *modules.Call, s *provision.StepRun[*modules.Runtime], in remediationInput) (any, error)) func(context.Context, *provision.StepRun[*modules.Runtime]) (any, error) {
	return func(ctx context.Context, s *provision.StepRun[*modules.Runtime]) (any, error) {
		var in remediationInput
		if err := json.Unmarshal(s.Input, &in); err != nil {
			return nil, provision.Permanent(fmt.Errorf("the run's input: %w", err))
		}
		var out any
		err := s.Runtime.DB.Tx(ctx, func(tx pgx.Tx) error {
			c := &modules.Call{
				Principal: iam.Principal{ID: "workflow:" + s.RunID, Kind: iam.KindService, TenantID: s.TenantID, Name: XIDRemediation},
				Target:    modules.Target{TenantID: s.TenantID, ResourceID: s.Subject, Existing: true, Kind: "node", Ref: s.Subject},
				Tx:        tx, Runtime: s.Runtime,
			}
			var err error
			out, err = fn(ctx, c, s, in)
			return err
		})
		return out, err
	}
}

// cordoned is the cordon step's output.
type cordoned struct {
	Cordoned bool `json:"cordoned"` // this run cordoned the node, and so uncordons it
}

func cordonForRemediation(ctx context.Context, c *modules.Call, _ *provision.StepRun[*modules.Runtime], _ remediationInput) (any, error) {
	n, err := lockNode(ctx, c)
	if err != nil {
		return nil, provision.Permanent(err)
	}
	if n.State != api.NodeActive {
		return cordoned{}, nil // cordoned, draining or retired already: someone else decides
	}
	_, err = transition(ctx, c, api.NodeCordoned, api.NodeActive)
	return cordoned{Cordoned: true}, err
}

func drainGPU(ctx context.Context, c *modules.Call, _ *provision.StepRun[*modules.Runtime], in remediationInput) (any, error) {
	span := capacity.GPUSpan(in.GPU)
	var holder string
	var until *time.Time // nil: until it is released
	err := c.Tx.QueryRow(ctx, `SELECT reservation_id::text, upper(during) FROM compute.bookings WHERE node_id = $1 AND resource = 'gpu'
		AND atoms && int4range($2, $3) AND during @> compute.compute_now() ORDER BY upper(during) DESC NULLS FIRST LIMIT 1`,
		c.Target.ResourceID, span.Lo, span.Hi).Scan(&holder, &until)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	end := "it is released"
	if until != nil {
		end = until.UTC().Format(time.RFC3339)
	}
	return nil, provision.Wait(remediationPoll, fmt.Sprintf("GPU %d is held by reservation %s until %s", in.GPU, holder, end))
}

// resetOutput is the reset step's output: the command it queued.
type resetOutput struct {
	Command string `json:"command"`
}

func resetGPU(ctx context.Context, c *modules.Call, s *provision.StepRun[*modules.Runtime], in remediationInput) (any, error) {
	// A step run again finds the command it queued before its process died, rather than
	// resetting twice.
	var id string
	err := c.Tx.QueryRow(ctx, `SELECT id::text FROM compute.commands WHERE node_id = $1 AND kind = $2 AND created_by = $3 ORDER BY created_at DESC LIMIT 1`,
		c.Target.ResourceID, api.CommandGPUReset, c.Principal.ID).Scan(&id)
	if err == nil {
		return resetOutput{Command: id}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	cmd, err := QueueCommand(ctx, c, c.Runtime.Registry, api.CreateCommand{NodeRef: api.NodeRef{Node: c.Target.ResourceID},
		Kind: api.CommandGPUReset, Args: json.RawMessage(fmt.Sprintf(`{"gpu": %d}`, in.GPU)), Deadline: "5m"})
	if api.CodeOf(err) == api.CodeInvalidArgument || api.CodeOf(err) == api.CodeNotFound {
		return nil, provision.Permanent(err)
	}
	return resetOutput{Command: cmd.ID}, err
}

func verifyGPU(ctx context.Context, c *modules.Call, s *provision.StepRun[*modules.Runtime], in remediationInput) (any, error) {
	var reset resetOutput
	if err := s.Output("reset", &reset); err != nil {
		return nil, provision.Permanent(err)
	}
	var state, why, health string
	err := c.Tx.QueryRow(ctx, `SELECT c.state, c.error, d.health FROM compute.commands c JOIN compute.devices d ON d.node_id = c.node_id AND d.index = $2
		WHERE c.id = $1`, reset.Command, in.GPU).Scan(&state, &why, &health)
	if err != nil {
		return nil, err
	}
	switch {
	case state == api.CommandFailed || state == api.CommandCancelled:
		return nil, provision.Permanent(fmt.Errorf("gpu.reset of GPU %d %s: %s", in.GPU, state, why))
	case state != api.CommandSucceeded:
		return nil, provision.Wait(remediationPoll, fmt.Sprintf("gpu.reset of GPU %d is %s", in.GPU, state))
	case health != api.HealthHealthy:
		return nil, provision.Wait(remediationPoll, fmt.Sprintf("GPU %d is %s after its reset", in.GPU, health))
	}
	return map[string]string{"health": health}, nil
}

func uncordonAfterRemediation(ctx context.Context, c *modules.Call, s *provision.StepRun[*modules.Runtime], _ remediationInput) (any, error) {
	var done cordoned
	if err := s.Output("cordon", &done); err != nil {
		return nil, provision.Permanent(err)
	}
	if !done.Cordoned {
		return map[string]bool{"uncordoned": false}, nil
	}
	n, err := lockNode(ctx, c)
	if err != nil {
		return nil, err
	}
	if n.State != api.NodeCordoned {
		return map[string]bool{"uncordoned": false}, nil // someone drained or retired it meanwhile
	}
	_, err = transition(ctx, c, api.NodeActive, api.NodeCordoned)
	return map[string]bool{"uncordoned": true}, err
}
