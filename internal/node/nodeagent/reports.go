package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Reports is the queue of an agent's module reports (agent/v1 Report): what its extensions tell
// the control plane, each sent in every session until the gateway acknowledges it. It lives in
// memory: a report's sender waits for its acknowledgement (Report blocks), so what a restart
// loses was never confirmed to anyone and is sent again by whoever asked (a ramdisk retries its
// progress until its site agent confirms it).
type Reports struct {
	mu      sync.Mutex
	pending map[string]*pendingReport
	order   []string // ids, oldest first
	wake    chan struct{}
	limit   int
}

type pendingReport struct {
	msg    *agentv1.Report
	sentAt time.Time // in the current session; zero: not sent in it
	done   chan string
}

// DefaultReportsLimit bounds the reports waiting for an acknowledgement.
const DefaultReportsLimit = 1024

// ErrReportsFull is the error of a report that finds the queue full: the control plane is not
// keeping up, or not reached; the caller should try again later.
var ErrReportsFull = errors.New("nodeagent: too many reports wait for the control plane; try again later")

// RefusedError is a report the control plane refused for good.
type RefusedError struct{ Kind, Reason string }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the control plane refused a %s report: %s", e.Kind, e.Reason)
}

// NewReports returns an empty queue; give it to Config.Reports and to the extensions that report.
func NewReports() *Reports {
	return &Reports{pending: map[string]*pendingReport{}, wake: make(chan struct{}, 1), limit: DefaultReportsLimit}
}

// Report sends payload (JSON-encoded) as a report of kind and waits until the control plane has
// recorded it, refused it (*RefusedError), or ctx ends. It implements ext.Reporter.
func (r *Reports) Report(ctx context.Context, kind string, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("nodeagent: encode a %s report: %w", kind, err)
	}
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	p := &pendingReport{msg: &agentv1.Report{Id: hex.EncodeToString(id), Kind: kind, Payload: b}, done: make(chan string, 1)}
	r.mu.Lock()
	if len(r.pending) >= r.limit {
		r.mu.Unlock()
		return ErrReportsFull
	}
	r.pending[p.msg.Id] = p
	r.order = append(r.order, p.msg.Id)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	select {
	case reason := <-p.done:
		if reason != "" {
			return &RefusedError{Kind: kind, Reason: reason}
		}
		return nil
	case <-ctx.Done():
		r.forget(p.msg.Id)
		return ctx.Err()
	}
}

// acked settles a report the gateway acknowledged.
func (r *Reports) acked(id, reason string) {
	r.mu.Lock()
	p := r.pending[id]
	r.mu.Unlock()
	if p == nil {
		return // a repeat, or its sender gave up
	}
	r.forget(id)
	p.done <- reason
}

func (r *Reports) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pending[id]; !ok {
		return
	}
	delete(r.pending, id)
	for i, o := range r.order {
		if o == id {
			r.order = append(r.order[:i:i], r.order[i+1:]...)
			break
		}
	}
}

// due returns, oldest first, the reports to send now: those not sent in this session (a new
// session starts with sessionStart), and those sent more than resendAfter ago without an answer.
func (r *Reports) due(sessionStart, now time.Time, resendAfter time.Duration) []*agentv1.Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*agentv1.Report
	for _, id := range r.order {
		p := r.pending[id]
		if p.sentAt.Before(sessionStart) || now.Sub(p.sentAt) > resendAfter {
			p.sentAt = now
			out = append(out, p.msg)
		}
	}
	return out
}

// reportResend is how long a report waits for its acknowledgement before it is sent again in
// the same session (the gateway acknowledges after its transaction; a failed one answers nothing).
const reportResend = 10 * time.Second

// sendReports sends the due reports whenever one is added, and again those unanswered, until
// the session ends.
func (s *nodeSession) sendReports(ctx context.Context, r *Reports, start time.Time) {
	tick := time.NewTicker(reportResend / 2)
	defer tick.Stop()
	for {
		for _, m := range r.due(start, time.Now(), reportResend) {
			if err := s.send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Report{Report: m}}); err != nil {
				s.cancel()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-tick.C:
		}
	}
}
