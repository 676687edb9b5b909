package gateway_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/attest"
)

// TestResultsAreTakenSignedOnly: a node's command result is recorded only when signed with the
// key of its session's certificate, for its node and session, in order; an unsigned, forged,
// misaddressed or replayed one is refused, with an event, and changes nothing. The signature
// is kept with the result and verifies later.
func TestResultsAreTakenSignedOnly(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	id, tc := p.rawJoin(t, "signer")
	n := p.rawConnect(t, id, tc, p.gw)
	key := tc.Certificates[0].PrivateKey.(crypto.Signer)
	cmd, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: id}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetCommand().GetId() == cmd.ID }); err != nil {
		t.Fatal(err)
	}
	result := &agentv1.CommandResult{CommandId: cmd.ID, Ok: true}
	signed := func(k crypto.Signer, body *agentv1.AttestedBody) *agentv1.NodeMessage {
		a, err := attest.Sign(k, body)
		if err != nil {
			t.Fatal(err)
		}
		return &agentv1.NodeMessage{Body: &agentv1.NodeMessage_Attested{Attested: a}}
	}
	body := func(node string, epoch, seq int64) *agentv1.AttestedBody {
		return &agentv1.AttestedBody{NodeId: node, Epoch: epoch, Seq: seq, Report: &agentv1.AttestedBody_Result{Result: result}}
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	refused := func(want string) {
		t.Helper()
		computetest.Eventually(t, patience, "a node.report_refused event saying "+want, func() bool {
			return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'node.report_refused' AND subject = $1 AND data->>'reason' LIKE '%'||$2||'%'`, id, want) == 1
		})
		if c, _ := p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: cmd.ID}); c.State == api.CommandSucceeded {
			t.Fatalf("a refused result (%s) was recorded", want)
		}
	}
	for _, bad := range []struct {
		msg  *agentv1.NodeMessage
		want string
	}{
		{&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Result{Result: result}}, "unsigned"},
		{signed(other, body(id, n.epoch, 1)), "forged"},
		{signed(key, body("0190a0b0-0000-7000-8000-000000000001", n.epoch, 1)), "signed for node"},
		{signed(key, body(id, n.epoch-1, 1)), "of session epoch"},
	} {
		if err := n.st.Send(bad.msg); err != nil {
			t.Fatal(err)
		}
		refused(bad.want)
	}

	// An unsigned inventory is refused too; a signed one becomes the node's devices.
	inv := &agentv1.Inventory{Gpus: []*agentv1.GPU{{Index: 0, Uuid: "GPU-signed-0", Name: "NVIDIA H100 80GB HBM3", MemoryMib: 81559, Health: "healthy"}}}
	if err := n.st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Inventory{Inventory: inv}}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the unsigned inventory refused", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'node.report_refused' AND subject = $1 AND data->>'kind' LIKE '%Inventory%'`, id) == 1
	})
	if c := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.devices WHERE node_id = $1`, id); c != 0 {
		t.Fatalf("an unsigned inventory made %d devices", c)
	}
	if err := n.st.Send(signed(key, &agentv1.AttestedBody{NodeId: id, Epoch: n.epoch, Seq: 2, Report: &agentv1.AttestedBody_Inventory{Inventory: inv}})); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the signed inventory's GPU", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.devices WHERE node_id = $1 AND uuid = 'GPU-signed-0'`, id) == 1
	})

	// Signed right: recorded, acknowledged, its attestation kept and verifiable.
	if err := n.st.Send(signed(key, body(id, n.epoch, 5))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.next(t, func(m *agentv1.ServerMessage) bool { return m.GetResultAck().GetCommandId() == cmd.ID }); err != nil {
		t.Fatal(err)
	}
	var att []byte
	if err := p.DB.Pool.QueryRow(p.ctx, `SELECT attestation FROM compute.commands WHERE id = $1 AND state = 'succeeded'`, cmd.ID).Scan(&att); err != nil {
		t.Fatalf("the signed result is not recorded: %v", err)
	}
	var a agentv1.Attested
	if err := proto.Unmarshal(att, &a); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(tc.Certificates[0].Certificate[0])
	if b, err := attest.Verify(cert.PublicKey, &a); err != nil || b.GetResult().GetCommandId() != cmd.ID {
		t.Fatalf("the kept attestation does not verify with the node's certificate: %v", err)
	}

	// The same report again, or an earlier one, is a replay.
	for _, seq := range []int64{5, 4} {
		if err := n.st.Send(signed(key, body(id, n.epoch, seq))); err != nil {
			t.Fatal(err)
		}
	}
	computetest.Eventually(t, patience, "the replays refused", func() bool {
		return computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'node.report_refused' AND subject = $1 AND data->>'reason' LIKE '%replayed%'`, id) == 3
	})
	// The node's reports are handled in order: both replays are refused, so neither could have
	// finished the command again.
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.events WHERE type = 'command.finished' AND subject = $1`, cmd.ID); n != 1 {
		t.Fatalf("%d command.finished events, want 1", n)
	}
}
