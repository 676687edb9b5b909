package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
)

// MaxReportBytes bounds a module report's payload.
const MaxReportBytes = 256 << 10

// report runs the handler a module registered for a report's kind, in a transaction, and
// acknowledges the report once it commits. A report no handler may take (an unknown kind, a
// role that may not send it, a payload the handler refuses) is acknowledged with the reason, so
// that the node forgets it; a failure of ours is not acknowledged, and the node sends it again.
func (s *session) report(ctx context.Context, r *agentv1.Report) error {
	refuse := func(format string, args ...any) error {
		s.ack(ctx, r.GetId(), fmt.Sprintf(format, args...))
		return nil
	}
	if r.GetId() == "" {
		return errors.New("a report without an id")
	}
	k, ok := s.g.rt.Registry.LookupReportKind(r.GetKind())
	switch {
	case !ok:
		return refuse("no module registered report kind %q", r.GetKind())
	case !slices.Contains(k.Roles, s.who.role):
		return refuse("a %s may not send %s reports", s.who.role, r.GetKind())
	case len(r.GetPayload()) > MaxReportBytes || !json.Valid(r.GetPayload()):
		return refuse("the payload of a %s report must be JSON of at most %d bytes", r.GetKind(), MaxReportBytes)
	}
	err := s.g.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		return k.Handle(ctx, &modules.Report{Tx: tx, Runtime: s.g.rt, NodeID: s.node, TenantID: s.who.tenant, PoolID: s.who.pool,
			Role: s.who.role, Payload: r.GetPayload()})
	})
	var ae *api.Error
	if errors.As(err, &ae) && ae.Code != api.CodeInternal && ae.Code != api.CodeUnavailable {
		return refuse("%s", ae.Message)
	}
	if err != nil {
		return fmt.Errorf("report %s (%s): %w", r.GetId(), r.GetKind(), err)
	}
	s.ack(ctx, r.GetId(), "")
	return nil
}

func (s *session) ack(ctx context.Context, id, errText string) {
	s.send(ctx, &agentv1.ServerMessage{Body: &agentv1.ServerMessage_ReportAck{ReportAck: &agentv1.ReportAck{Id: id, Error: errText}}})
}
