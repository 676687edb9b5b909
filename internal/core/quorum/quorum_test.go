package quorum_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// people are the principals of a quorum test: alice asks, bob and carol approve. aliceAgain is
// a second key of alice's identity: the same principal.
type people struct {
	env                           *computetest.Env
	alice, aliceAgain, bob, carol string
	pool                          string
	nodes                         []string // ids, n0 … in order
	ctx                           context.Context
}

func newPeople(t *testing.T, nodes int) *people {
	t.Helper()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	key := func(name string) string {
		k, err := env.IAM.CreateAdminKey(ctx, computetest.RootTenantID, name)
		if err != nil {
			t.Fatal(err)
		}
		return k.Token
	}
	p := &people{env: env, alice: key("alice"), aliceAgain: key("alice"), bob: key("bob"), carol: key("carol"), ctx: ctx}
	p.pool, p.nodes = aPool(t, env, "p1", nodes)
	return p
}

// aPool makes a pool of n online, healthy nodes with 8 GPUs each, and returns its id and theirs.
func aPool(t *testing.T, env *computetest.Env, name string, n int) (string, []string) {
	t.Helper()
	ctx := context.Background()
	pool, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		node, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: pool.ID, Name: fmt.Sprintf("n%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, node.ID); err != nil {
			t.Fatal(err)
		}
		inv := capacity.Inventory{VCPUs: 64, MemoryGiB: 512}
		for g := range 8 {
			inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d-%d", name, i, g), Name: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559})
		}
		if err := capacity.SetInventory(ctx, env.DB.Pool, node.ID, inv); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, node.ID)
	}
	return pool.ID, ids
}

func (p *people) setPolicy(t *testing.T, in api.SetQuorum) api.QuorumPolicy {
	t.Helper()
	pol, err := p.env.Compute.API.Quorum.Set(p.ctx, p.alice, in)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

func (p *people) drain(who string, end bool, approval string, nodes ...string) (api.NodeBatch, error) {
	return p.env.Compute.API.Nodes.DrainMany(p.ctx, who, api.DrainNodes{Pool: "p1", Nodes: nodes, End: end, Approval: approval})
}

// wantCode fails unless err is an *api.Error of code with details reason, and returns it.
func wantCode(t *testing.T, what string, err error, code api.Code, reason string) *api.Error {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code || (reason != "" && ae.Details["reason"] != reason) {
		t.Fatalf("%s: got %v, want %s (reason %q)", what, err, code, reason)
	}
	return ae
}

func (p *people) states(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	rows, err := p.env.DB.Pool.Query(p.ctx, `SELECT name, state FROM compute.nodes WHERE pool_id = $1`, p.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n, s string
		if err := rows.Scan(&n, &s); err != nil {
			t.Fatal(err)
		}
		out[n] = s
	}
	return out
}

func (p *people) events(t *testing.T, typ, subject string) int {
	t.Helper()
	var n int
	if err := p.env.DB.Pool.QueryRow(p.ctx, `SELECT count(*) FROM compute.events WHERE type = $1 AND subject = $2`, typ, subject).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestABatchOverThePolicyRunsOnceWithAnotherPrincipalsApproval walks the quorum end to end with
// two principals of the embedded IAM: the batch over the policy is refused with an approval to
// ask for, its caller cannot approve it (even with another key), another principal's approval
// lets exactly that batch run once, and nothing else spends it.
func TestABatchOverThePolicyRunsOnceWithAnotherPrincipalsApproval(t *testing.T) {
	t.Parallel()
	p := newPeople(t, 6)
	api0 := p.env.Compute.API

	// No policy: a batch runs as it is.
	if _, err := p.drain(p.alice, false, "", "n0", "n1", "n5"); err != nil {
		t.Fatalf("a batch without a policy: %v", err)
	}
	if _, err := api0.Nodes.Uncordon(p.ctx, p.alice, api.UncordonNode{NodeRef: api.NodeRef{Pool: "p1", Node: "n0"}}); err != nil {
		t.Fatal(err)
	}
	pol := p.setPolicy(t, api.SetQuorum{MaxNodes: 2})
	if pol.From != computetest.RootTenantID || pol.Approvers != 1 || pol.TTL != "1h0m0s" {
		t.Fatalf("quorum.set = %+v, want the root's own policy with 1 approver and a ttl of 1h", pol)
	}
	// Within the policy (2 nodes): runs without an approval.
	if _, err := p.drain(p.alice, false, "", "n0"); err != nil {
		t.Fatalf("a batch within the policy: %v", err)
	}
	// A reservation on one of n2…n4 (the only nodes that take bookings now), so that end: true
	// has something to end.
	r, err := api0.Reservations.Create(p.ctx, p.alice, api.CreateReservation{Pool: "p1", Shape: api.Shape{GPUs: 8}})
	if err != nil {
		t.Fatal(err)
	}

	// Over it: confirmation_required, nothing changed, an approval to ask for.
	before := p.states(t)
	_, err = p.drain(p.alice, true, "", "n2", "n3", "n4")
	ae := wantCode(t, "3 nodes over a policy of 2", err, api.CodeConfirmationRequired, "quorum")
	id, _ := ae.Details["approvalId"].(string)
	if id == "" {
		t.Fatalf("the refusal names no approval: %+v", ae)
	}
	if after := p.states(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused batch changed nodes: %v → %v", before, after)
	}
	if p.events(t, "approval.requested", id) != 1 {
		t.Fatal("no approval.requested event")
	}
	// Asking again, the nodes in another order and one by name and the others by id: the same batch, the same approval.
	_, err = p.drain(p.alice, true, "", "n4", p.nodes[3], "n2")
	if again := wantCode(t, "the same batch again", err, api.CodeConfirmationRequired, "quorum"); again.Details["approvalId"] != id {
		t.Fatalf("the same batch asked again opened approval %v, want %s", again.Details["approvalId"], id)
	}
	// Retrying with the approval while it is pending: still waiting.
	_, err = p.drain(p.alice, true, id, "n2", "n3", "n4")
	wantCode(t, "the batch with a pending approval", err, api.CodeConfirmationRequired, "quorum")

	// Its caller may not approve it, with another key of theirs either.
	_, err = api0.Approvals.Approve(p.ctx, p.aliceAgain, api.DecideApproval{Approval: id})
	wantCode(t, "alice approving her own batch", err, api.CodePermissionDenied, "own_request")

	// Bob may.
	a, err := api0.Approvals.Approve(p.ctx, p.bob, api.DecideApproval{Approval: id, Comment: "rack 7 maintenance"})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != api.ApprovalApproved || len(a.Votes) != 1 || !a.Votes[0].Approve || a.Votes[0].Comment != "rack 7 maintenance" || len(a.Targets) != 3 || a.Params["end"] != true {
		t.Fatalf("the approval after bob's vote = %+v", a)
	}
	if p.events(t, "approval.approved", id) != 1 {
		t.Fatal("no approval.approved event")
	}

	// The approval runs only its own batch, for its own caller.
	_, err = p.drain(p.bob, true, id, "n2", "n3", "n4")
	wantCode(t, "bob running alice's batch", err, api.CodePermissionDenied, "not_requester")
	_, err = p.drain(p.alice, true, id, "n2", "n3", "n5")
	wantCode(t, "another set of nodes", err, api.CodeFailedPrecondition, "approval_mismatch")
	_, err = p.drain(p.alice, false, id, "n2", "n3", "n4")
	wantCode(t, "other parameters (end: false)", err, api.CodeFailedPrecondition, "approval_mismatch")
	_, err = api0.Nodes.RetireMany(p.ctx, p.alice, api.RetireNodes{Pool: "p1", Nodes: []string{"n2", "n3", "n4"}, Approval: id})
	wantCode(t, "another method", err, api.CodeFailedPrecondition, "approval_mismatch")

	// The approved batch runs, once.
	b, err := p.drain(p.alice, true, id, "n3", "n4", "n2")
	if err != nil {
		t.Fatal(err)
	}
	if b.Approval != id || len(b.Nodes) != 3 || b.Nodes[0].Name != "n3" || b.Nodes[2].Name != "n2" {
		t.Fatalf("the batch answered %+v", b)
	}
	if st := p.states(t); st["n2"] != api.NodeDraining || st["n3"] != api.NodeDraining || st["n4"] != api.NodeDraining {
		t.Fatalf("after the approved batch, nodes are %v", st)
	}
	got, err := api0.Reservations.Get(p.ctx, p.alice, api.GetReservation{Reservation: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got.State == api.ReservationActive {
		t.Fatalf("drain with end: true left the reservation on its node %s", got.State)
	}
	if a, _ = api0.Approvals.Get(p.ctx, p.bob, api.ApprovalRef{Approval: id}); a.State != api.ApprovalConsumed || a.ConsumedAt == nil {
		t.Fatalf("the spent approval is %+v", a)
	}
	if p.events(t, "approval.consumed", id) != 1 {
		t.Fatal("no approval.consumed event")
	}
	_, err = p.drain(p.alice, true, id, "n2", "n3", "n4")
	wantCode(t, "the approval again", err, api.CodeFailedPrecondition, "approval_consumed")
}

// TestApprovalsExpireAndCanBeDenied: an approved approval past its ttl no longer runs its batch
// nor takes votes; a denied one never runs it; the policy's approvers count distinct principals.
func TestApprovalsExpireAndCanBeDenied(t *testing.T) {
	t.Parallel()
	p := newPeople(t, 4)
	api0 := p.env.Compute.API
	p.setPolicy(t, api.SetQuorum{MaxPercent: 50, Approvers: 2, TTL: "10m"})
	ask := func(nodes ...string) string {
		t.Helper()
		_, err := p.drain(p.alice, false, "", nodes...)
		return wantCode(t, fmt.Sprint("draining ", nodes), err, api.CodeConfirmationRequired, "quorum").Details["approvalId"].(string)
	}
	// 2 of 4 nodes is 50%: allowed; 3 is 75%: over.
	if _, err := p.drain(p.alice, false, "", "n0", "n1"); err != nil {
		t.Fatalf("half the pool under a 50%% policy: %v", err)
	}
	if _, err := api0.Nodes.Uncordon(p.ctx, p.alice, api.UncordonNode{NodeRef: api.NodeRef{Pool: "p1", Node: "n0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := api0.Nodes.Uncordon(p.ctx, p.alice, api.UncordonNode{NodeRef: api.NodeRef{Pool: "p1", Node: "n1"}}); err != nil {
		t.Fatal(err)
	}
	id := ask("n0", "n1", "n2")

	// Two approvers: bob's one vote is not enough, nor is bob twice.
	if a, err := api0.Approvals.Approve(p.ctx, p.bob, api.DecideApproval{Approval: id}); err != nil || a.State != api.ApprovalPending {
		t.Fatalf("bob's approval of 2 needed: %+v, %v", a, err)
	}
	_, err := api0.Approvals.Approve(p.ctx, p.bob, api.DecideApproval{Approval: id})
	wantCode(t, "bob again", err, api.CodeConflict, "already_voted")
	_, err = p.drain(p.alice, false, id, "n0", "n1", "n2")
	wantCode(t, "a batch with 1 of 2 approvals", err, api.CodeConfirmationRequired, "quorum")
	if a, err := api0.Approvals.Approve(p.ctx, p.carol, api.DecideApproval{Approval: id}); err != nil || a.State != api.ApprovalApproved {
		t.Fatalf("carol's approval, the second: %+v, %v", a, err)
	}
	list, err := api0.Approvals.List(p.ctx, p.bob, api.ListApprovals{State: api.ApprovalApproved})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != id {
		t.Fatalf("approvals.list approved = %+v, %v", list, err)
	}

	// Eleven minutes later it has expired: it runs nothing, and takes no more votes.
	p.env.DB.SetNow(time.Now().Add(11 * time.Minute))
	_, err = p.drain(p.alice, false, id, "n0", "n1", "n2")
	wantCode(t, "an expired approval", err, api.CodeFailedPrecondition, "approval_expired")
	if a, _ := api0.Approvals.Get(p.ctx, p.bob, api.ApprovalRef{Approval: id}); a.State != api.ApprovalExpired {
		t.Fatalf("the approval past its ttl reads %s", a.State)
	}
	if st := p.states(t); st["n2"] != api.NodeActive {
		t.Fatalf("n2 is %s after its batch's approval expired", st["n2"])
	}
	// Asking again opens a new approval.
	id2 := ask("n0", "n1", "n2")
	if id2 == id {
		t.Fatal("the expired approval was handed out again")
	}

	// Denied by carol: it never runs, and bob can no longer approve it.
	if a, err := api0.Approvals.Deny(p.ctx, p.carol, api.DecideApproval{Approval: id2, Comment: "not during the launch"}); err != nil || a.State != api.ApprovalDenied {
		t.Fatalf("carol's denial: %+v, %v", a, err)
	}
	if p.events(t, "approval.denied", id2) != 1 {
		t.Fatal("no approval.denied event")
	}
	_, err = api0.Approvals.Approve(p.ctx, p.bob, api.DecideApproval{Approval: id2})
	wantCode(t, "approving a denied approval", err, api.CodeFailedPrecondition, "approval_denied")
	_, err = p.drain(p.alice, false, id2, "n0", "n1", "n2")
	wantCode(t, "a denied approval", err, api.CodeFailedPrecondition, "approval_denied")
	if st := p.states(t); st["n0"] != api.NodeActive || st["n2"] != api.NodeActive {
		t.Fatalf("nodes changed by denied batches: %v", st)
	}
}

// TestQuorumPolicyIsInheritedAndCheckedPerTenant: a tenant without a policy of its own has its
// nearest ancestor's; an approval of one tenant is not found from another; bad policies are
// refused naming the field.
func TestQuorumPolicyIsInheritedAndCheckedPerTenant(t *testing.T) {
	t.Parallel()
	p := newPeople(t, 3)
	api0 := p.env.Compute.API
	child, childKey := p.env.Tenant(t, "t1")
	p.setPolicy(t, api.SetQuorum{MaxNodes: 1})
	pol, err := api0.Quorum.Get(p.ctx, childKey, api.GetQuorum{})
	if err != nil || pol.From != computetest.RootTenantID || pol.MaxNodes != 1 || pol.TenantID != child {
		t.Fatalf("the child's policy = %+v, %v; want the root's", pol, err)
	}
	if _, err := api0.Pools.Create(p.ctx, childKey, api.CreatePool{Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	_, err = p.drain(p.alice, false, "", "n0", "n1")
	id := wantCode(t, "root batch", err, api.CodeConfirmationRequired, "quorum").Details["approvalId"].(string)
	_, err = api0.Approvals.Approve(p.ctx, childKey, api.DecideApproval{Approval: id})
	wantCode(t, "a child tenant approving the root's batch", err, api.CodeNotFound, "")

	for _, bad := range []struct {
		in    api.SetQuorum
		field string
	}{
		{api.SetQuorum{MaxPercent: 101}, "maxPercent"},
		{api.SetQuorum{MaxNodes: -1}, "maxNodes"},
		{api.SetQuorum{Approvers: 11}, "approvers"},
		{api.SetQuorum{TTL: "10s"}, "ttl"},
		{api.SetQuorum{TTL: "soon"}, "ttl"},
	} {
		_, err := api0.Quorum.Set(p.ctx, p.alice, bad.in)
		if ae := wantCode(t, fmt.Sprintf("%+v", bad.in), err, api.CodeInvalidArgument, ""); ae.Details["field"] != bad.field {
			t.Fatalf("%+v refused naming %v, want %s", bad.in, ae.Details["field"], bad.field)
		}
	}
	_, err = p.drain(p.alice, false, "", "n0", "n0")
	wantCode(t, "a node named twice", err, api.CodeInvalidArgument, "")
	_, err = p.drain(p.alice, false, "", "n0", p.nodes[0])
	wantCode(t, "a node named by name and id", err, api.CodeInvalidArgument, "")
}
