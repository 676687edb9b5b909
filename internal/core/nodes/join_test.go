package nodes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

type joinPlane struct {
	env *computetest.Env
	url string
	ctx context.Context
}

func newJoinPlane(t testing.TB) *joinPlane {
	env := computetest.New(t, computetest.Options{})
	p := &joinPlane{env: env, url: env.Server(t), ctx: context.Background()}
	if _, err := env.Compute.API.Pools.Create(p.ctx, env.RootKey, api.CreatePool{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *joinPlane) token(t *testing.T, in api.CreateJoinToken) api.JoinToken {
	t.Helper()
	in.Pool = "p"
	jt, err := p.env.Compute.API.JoinTokens.Create(p.ctx, p.env.RootKey, in)
	if err != nil {
		t.Fatal(err)
	}
	return jt
}

func (p *joinPlane) join(jt api.JoinToken, secret []byte) (nodeagent.Identity, error) {
	return nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: jt.CAHash, TakeoverSecret: secret,
		Facts: &agentv1.MachineFacts{Hostname: "gpu-1", MachineId: "0123456789abcdef"}})
}

func (p *joinPlane) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := p.env.DB.Pool.QueryRow(p.ctx, q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTakeoverNeedsProof: a join token, a name and a machine id (all a stranger can learn) do
// not take over a node; its takeover secret or a takeover token for it do.
func TestTakeoverNeedsProof(t *testing.T) {
	t.Parallel()
	p := newJoinPlane(t)
	first, err := p.join(p.token(t, api.CreateJoinToken{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.TakeoverSecret) != 32 {
		t.Fatalf("the identity keeps a takeover secret of %d bytes", len(first.TakeoverSecret))
	}

	// A stranger with a fresh token, the node's name and machine id is refused and spends nothing.
	stranger := p.token(t, api.CreateJoinToken{})
	if _, err := p.join(stranger, nil); err == nil || !strings.Contains(err.Error(), "permission_denied") || !strings.Contains(err.Error(), "takeover") {
		t.Fatalf("a takeover without proof: %v, want permission_denied naming the takeover", err)
	}
	if n := p.count(t, `SELECT uses_left FROM compute.join_tokens WHERE id = $1`, stranger.ID); n != 1 {
		t.Fatalf("the refused takeover spent its token (uses left %d)", n)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.certificates WHERE subject = $1 AND revoked_at IS NULL`, first.NodeID); n != 1 {
		t.Fatalf("the refused takeover revoked the node's certificate (%d unrevoked)", n)
	}

	// The node itself, with its secret, joins again as the same node; its old certificate is revoked.
	again, err := p.join(p.token(t, api.CreateJoinToken{}), first.TakeoverSecret)
	if err != nil {
		t.Fatalf("a rejoin with the takeover secret: %v", err)
	}
	if again.NodeID != first.NodeID {
		t.Fatalf("the rejoin made node %s, want %s", again.NodeID, first.NodeID)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.certificates WHERE subject = $1 AND revoked_at IS NULL`, first.NodeID); n != 1 {
		t.Fatalf("%d unrevoked certificates after the takeover, want 1", n)
	}

	// An operator's takeover token admits a machine without the secret (a reinstall), and the
	// old secret stops working.
	scoped := p.token(t, api.CreateJoinToken{Node: "gpu-1"})
	if scoped.NodeID != first.NodeID {
		t.Fatalf("the takeover token is for %q, want %s", scoped.NodeID, first.NodeID)
	}
	reinstalled, err := p.join(scoped, nil)
	if err != nil || reinstalled.NodeID != first.NodeID {
		t.Fatalf("a takeover with a takeover token: %+v, %v", reinstalled.NodeID, err)
	}
	if _, err := p.join(p.token(t, api.CreateJoinToken{}), first.TakeoverSecret); err == nil {
		t.Fatal("the secret of the machine that was taken over still takes the node over")
	}
	if _, err := p.join(p.token(t, api.CreateJoinToken{}), reinstalled.TakeoverSecret); err != nil {
		t.Fatalf("the new machine's secret: %v", err)
	}

	// A takeover token admits only its node: not a new name.
	other := p.token(t, api.CreateJoinToken{Node: first.NodeID})
	_, err = nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: other.Token,
		Facts: &agentv1.MachineFacts{Hostname: "gpu-2", MachineId: "x"}})
	if err == nil || !strings.Contains(err.Error(), "permission_denied") {
		t.Fatalf("a takeover token used for another name: %v", err)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.nodes`); n != 1 {
		t.Fatalf("%d nodes, want 1", n)
	}
	// A takeover token for a node that does not exist is refused when it is made.
	_, err = p.env.Compute.API.JoinTokens.Create(p.ctx, p.env.RootKey, api.CreateJoinToken{Pool: "p", Node: "nope"})
	if ae, ok := err.(*api.Error); !ok || ae.Code != api.CodeInvalidArgument {
		t.Fatalf("a takeover token for an unknown node: %v", err)
	}
}

// TestJoinPinsTheCA: the CA hash printed with the token is checked before anything is trusted,
// and plain http is refused except on loopback.
func TestJoinPinsTheCA(t *testing.T) {
	t.Parallel()
	p := newJoinPlane(t)
	jt := p.token(t, api.CreateJoinToken{MaxUses: 10})
	if !strings.HasPrefix(jt.CAHash, "sha256:") || len(jt.CAHash) != len("sha256:")+64 {
		t.Fatalf("the token's CA hash is %q", jt.CAHash)
	}
	facts := &agentv1.MachineFacts{Hostname: "pinned", MachineId: "m"}
	wrong := "sha256:" + strings.Repeat("ab", 32)
	if _, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: wrong, Facts: facts}); err == nil || !strings.Contains(err.Error(), "--ca-hash") {
		t.Fatalf("a join whose CA does not match the pin: %v", err)
	}
	for _, bad := range []string{"ab", "sha1:" + strings.Repeat("ab", 32), "sha256:zz"} {
		if _, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: bad, Facts: facts}); err == nil || !strings.Contains(err.Error(), "--ca-hash") {
			t.Errorf("a malformed --ca-hash %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"http://compute.example.com", "http://10.0.0.1:8080", "ftp://127.0.0.1", "127.0.0.1:8080"} {
		if _, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: bad, Token: jt.Token, Facts: facts}); err == nil || !strings.Contains(err.Error(), "--url") {
			t.Errorf("joining through %q: %v, want a refusal naming --url", bad, err)
		}
	}
	// Plain http to another host is allowed only with the CA pinned and PlainHTTP (a deploy's
	// one-use credential): without the pin it is still refused.
	if _, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: "http://10.0.0.1:8080", Token: jt.Token, PlainHTTP: true, Facts: facts}); err == nil || !strings.Contains(err.Error(), "--url") {
		t.Errorf("plain http without a pin, even with PlainHTTP: %v, want a refusal naming --url", err)
	}
	ctx, cancel := context.WithTimeout(p.ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := nodeagent.JoinWith(ctx, nodeagent.JoinOptions{URL: "http://192.0.2.1:1", Token: jt.Token, CAHash: jt.CAHash, PlainHTTP: true, Facts: facts}); err == nil || strings.Contains(err.Error(), "--url") {
		t.Errorf("plain http with a pin and PlainHTTP: %v, want it tried (and not reached)", err)
	}
	// (The refused join above did reach the server: the pin protects the node from trusting a CA
	// not its own; the token is protected by https, which every non-loopback join must use.)
	facts.Hostname = "pinned-2"
	id, err := nodeagent.JoinWith(p.ctx, nodeagent.JoinOptions{URL: p.url, Token: jt.Token, CAHash: jt.CAHash, Facts: facts})
	if err != nil {
		t.Fatalf("a join with the right pin on loopback http: %v", err)
	}
	if err := nodeagent.CheckCertificate(id.KeyDER, id.CertDER, id.CADER, id.NotAfter.Add(-2*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestJoinTokenIsNotKeptForReplay: the idempotency record of joinTokens.create must not hold
// the token (anyone who can read the table could join machines); a replay answers the token's
// record without it.
func TestJoinTokenIsNotKeptForReplay(t *testing.T) {
	t.Parallel()
	p := newJoinPlane(t)
	ctx := api.WithIdempotencyKey(p.ctx, "jt-1")
	first, err := p.env.Compute.API.JoinTokens.Create(ctx, p.env.RootKey, api.CreateJoinToken{Pool: "p"})
	if err != nil || first.Token == "" {
		t.Fatalf("create: %+v, %v", first, err)
	}
	if n := p.count(t, `SELECT count(*) FROM compute.idempotency_keys WHERE position($1 in convert_from(response::text::bytea, 'UTF8')) > 0`, first.Token); n != 0 {
		t.Fatal("the idempotency record keeps the join token in plain text")
	}
	again, err := p.env.Compute.API.JoinTokens.Create(ctx, p.env.RootKey, api.CreateJoinToken{Pool: "p"})
	if err != nil || again.ID != first.ID || again.Token != "" {
		t.Fatalf("replay: %+v, %v; want the same token's record without the token", again, err)
	}
}
