package nodes_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/agent/v1/agentv1connect"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// FuzzJoinFacts: whatever a joining machine says about itself (NULs, control characters, long
// or odd names, any CSR bytes), the join is admitted or refused with a client error that says
// why, never an internal error; and a refused join spends no token.
func FuzzJoinFacts(f *testing.F) {
	_, csr, err := nodeagent.NewKey()
	if err != nil {
		f.Fatal(err)
	}
	f.Add("gpu-1", "0123456789abcdef", "linux", "6.8.0", "amd64", "v0.1.0", true)
	f.Add("a\x00b", "m", "linux", "", "", "", true)
	f.Add("ok", "m\x00", "linux\x00", "", "", "", true)
	f.Add("ok2", "m", "\x1b[31mred", "", "", "", true)
	f.Add(strings.Repeat("a", 300), "m", "", "", "", "", true)
	f.Add("ok3", strings.Repeat("m", 5000), "", "", "", "", true)
	f.Add("UPPER.Case", "m", "", "", "", "", true)
	f.Add("-dash", "m", "", "", "", "", true)
	f.Add("ok4", "m", "", "", "", "", false)
	f.Add("ok5", "\u2028", "\ufeff", "", "", "", true)
	p := newJoinPlane(f)
	client := agentv1connect.NewJoinServiceClient(http.DefaultClient, p.url)
	jt, err := p.env.Compute.API.JoinTokens.Create(p.ctx, p.env.RootKey, api.CreateJoinToken{Pool: "p", MaxUses: api.MaxJoinTokenUses})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, host, machine, os, kernel, arch, version string, goodCSR bool) {
		for _, s := range []string{host, machine, os, kernel, arch, version} {
			if !utf8.ValidString(s) {
				return // protobuf strings are UTF-8: the client cannot send these
			}
		}
		der := csr
		if !goodCSR {
			der = []byte(host + machine)
		}
		before := p.count(t, `SELECT uses_left FROM compute.join_tokens WHERE id = $1`, jt.ID)
		_, err := client.Join(p.ctx, connect.NewRequest(&agentv1.JoinRequest{Token: jt.Token, CsrDer: der,
			Facts: &agentv1.MachineFacts{Hostname: host, MachineId: machine, Os: os, Kernel: kernel, Arch: arch, AgentVersion: version}}))
		if err == nil {
			return
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() == connect.CodeInternal || ce.Code() == connect.CodeUnknown || ce.Code() == connect.CodeUnavailable {
			t.Fatalf("join with facts %q %q %q %q %q %q: %v", host, machine, os, kernel, arch, version, err)
		}
		if after := p.count(t, `SELECT uses_left FROM compute.join_tokens WHERE id = $1`, jt.ID); after != before {
			t.Fatalf("a refused join (%v) spent the token", err)
		}
	})
}
