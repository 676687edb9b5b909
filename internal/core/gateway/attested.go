package gateway

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/lib/attest"
)

// verify checks an attested report: signed with the key of this session's certificate, of this
// node, of this session, and after the last one; why is empty when it holds.
func (s *session) verify(a *agentv1.Attested) (body *agentv1.AttestedBody, why string) {
	body, err := attest.Verify(s.pub, a)
	switch {
	case errors.Is(err, attest.ErrForged):
		return nil, "forged: the signature is not the node's key's"
	case err != nil:
		return nil, err.Error()
	case body.GetNodeId() != s.node:
		return nil, fmt.Sprintf("signed for node %s", body.GetNodeId())
	case body.GetEpoch() != s.epoch:
		return nil, fmt.Sprintf("of session epoch %d, not this one's (%d): replayed", body.GetEpoch(), s.epoch)
	case body.GetSeq() <= s.seq:
		return nil, fmt.Sprintf("report %d comes after report %d: replayed", body.GetSeq(), s.seq)
	}
	s.seq = body.GetSeq()
	return body, ""
}

// refuseReport records a refused report as an event; the session goes on (the node may be an old
// version; an attacker learns nothing from it).
func (s *session) refuseReport(ctx context.Context, why, kind string) error {
	s.g.log.WarnContext(ctx, "gateway: refused a node's report", "node", s.node, "reason", why, "kind", kind)
	return events.Emit(ctx, s.g.rt.DB.Pool, "node.report_refused", s.who.tenant, s.node, map[string]any{"reason": why, "kind": kind})
}

// result records a command's result with its attestation, and acknowledges it.
func (s *session) result(ctx context.Context, r *agentv1.CommandResult, a *agentv1.Attested) error {
	g := s.g
	out, _ := r.GetOutput().MarshalJSON()
	if r.GetOutput() == nil {
		out = nil
	}
	att, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	c, recorded, err := nodes.Complete(ctx, g.rt.DB.Pool, s.node, r.GetCommandId(), r.GetOk(), r.GetError(), out, att)
	if err != nil {
		return err
	}
	if recorded {
		g.cfg.Metrics.Command(c.Kind, r.GetOk(), c.RoundTrip)
	}
	// Acknowledged whether first or repeated, so the node can forget it.
	s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_ResultAck{ResultAck: &agentv1.ResultAck{CommandId: r.GetCommandId()}}})
	return nil
}
