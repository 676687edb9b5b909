package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/sim"
)

// TestSiteTokensAdmitSiteAgents: a join token of role site (a site token) needs a pool of a site
// and admits a site agent: a node of role site, whose certificate says so, whose inventory is
// not the pool's capacity, listed apart. A certificate of the other role for the same node is
// refused at the session.
func TestSiteTokensAdmitSiteAgents(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	a, key := p.Compute.API, p.RootKey
	if _, err := a.JoinTokens.Create(p.ctx, key, api.CreateJoinToken{Pool: "h100", Role: api.RoleSite}); api.CodeOf(err) != api.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "pool of a site") {
		t.Fatalf("a site token for a pool without a site = %v, want invalid_argument naming the pool", err)
	}
	if _, err := a.JoinTokens.Create(p.ctx, key, api.CreateJoinToken{Pool: "h100", Role: "bmc"}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a token of an unknown role = %v, want invalid_argument", err)
	}
	if _, err := a.Sites.Create(p.ctx, key, api.CreateSite{Name: "fra1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pools.Create(p.ctx, key, api.CreatePool{Name: "fra1-infra", Site: "fra1"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(p.ctx, key, api.CreateJoinToken{Pool: "fra1-infra", Role: api.RoleSite})
	if err != nil || jt.Role != api.RoleSite {
		t.Fatalf("site token = %+v, %v", jt, err)
	}
	f, err := sim.Start(p.ctx, sim.Options{URL: p.url, Token: jt.Token, Gateway: p.gw, Nodes: 1, GPUs: 8, Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	ctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
	defer cancel()
	if err := f.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	agent := f.Nodes[0]
	id, _, _ := agent.Store.Identity()
	cert, err := x509.ParseCertificate(id.CertDER)
	if err != nil || pki.Role(cert) != api.RoleSite {
		t.Fatalf("the site agent's certificate is of role %q (%v), want site", pki.Role(cert), err)
	}
	sites, err := a.Nodes.List(p.ctx, key, api.ListNodes{Role: api.RoleSite})
	if err != nil || len(sites.Items) != 1 || sites.Items[0].ID != agent.NodeID() || sites.Items[0].Role != api.RoleSite {
		t.Fatalf("nodes of role site = %+v, %v", sites, err)
	}
	if nodes, err := a.Nodes.List(p.ctx, key, api.ListNodes{Role: api.RoleNode}); err != nil || len(nodes.Items) != 0 {
		t.Fatalf("nodes of role node = %+v, %v; want none", nodes, err)
	}
	// It reported 8 fake GPUs; none is the pool's. A node's reports are handled in order: once
	// the result of an inventory refresh is in, its inventories before it have been taken.
	refresh, err := a.Commands.Create(p.ctx, key, api.CreateCommand{NodeRef: api.NodeRef{Node: agent.NodeID()}, Kind: api.CommandInventoryRefresh})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the site agent's inventory refresh done", func() bool {
		c, err := a.Commands.Get(p.ctx, key, api.GetCommand{Command: refresh.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	if n := computetest.Count(t, p.DB.Pool, `SELECT count(*) FROM compute.devices WHERE node_id = $1`, agent.NodeID()); n != 0 {
		t.Fatalf("a site agent's inventory recorded %d devices, want none", n)
	}

	// The same node with a certificate issued for a node (not a site): refused at the session.
	ca, err := pki.Load(p.ctx, p.DB, computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, csr, err := nodeagent.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	der, _, err := ca.IssueNode(p.ctx, p.DB.Pool, agent.NodeID(), api.RoleNode, csr, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := x509.ParsePKCS8PrivateKey(keyDER)
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca.Pool(), Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: k}}}
	conn, err := grpc.NewClient(p.gw, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := agentv1.NewSessionServiceClient(conn).Connect(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The refusal may come before the hello is sent: the send then fails with io.EOF, and the
	// receive answers the refusal.
	if err := st.Send(&agentv1.NodeMessage{Body: &agentv1.NodeMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "test"}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err == nil || !strings.Contains(err.Error(), "is a site, and its certificate was issued for a node") {
		t.Fatalf("a node certificate for a site agent's session = %v, %v; want a refusal naming both roles", m, err)
	}
}

// TestGPUModesTravelInTheDesiredState: a node's desired state carries its GPUs' modes, and a
// mode change moves it (the node makes or tears down MIG instances by it); an inventory that
// changes nothing of the modes does not.
func TestGPUModesTravelInTheDesiredState(t *testing.T) {
	t.Parallel()
	p := newPlane(t, nil)
	f := p.fleet(t, 1, "modes", p.gw)
	node := f.Nodes[0]
	modeOf := func(index int32) string {
		for _, g := range node.Converger.Last().GetGpus() {
			if g.GetIndex() == index {
				return g.GetMode()
			}
		}
		return ""
	}
	computetest.Eventually(t, patience, "the GPUs' modes in the desired state", func() bool { return len(node.Converger.Last().GetGpus()) == 8 && modeOf(3) == api.GPUModeWhole })
	gen := node.Converger.Last().GetGeneration()
	devs, err := p.Compute.API.Devices.List(p.ctx, p.RootKey, api.ListDevices{Node: node.NodeID()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Compute.API.Devices.SetMode(p.ctx, p.RootKey, api.SetGPUMode{Device: devs[3].UUID, Mode: api.GPUModeMIG}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "GPU 3 in MIG mode in the desired state", func() bool { return modeOf(3) == api.GPUModeMIG })
	if g := node.Converger.Last().GetGeneration(); g != gen+1 {
		t.Fatalf("generation %d after one mode change, want %d", g, gen+1)
	}
	// The same inventory again: no new generation. A node's reports are handled in order: once
	// the refresh's result is in, its inventory has been taken, and a generation it moved would
	// be in the database.
	refresh, err := p.Compute.API.Commands.Create(p.ctx, p.RootKey, api.CreateCommand{NodeRef: api.NodeRef{Node: node.NodeID()}, Kind: api.CommandInventoryRefresh})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, patience, "the inventory refresh done", func() bool {
		c, err := p.Compute.API.Commands.Get(p.ctx, p.RootKey, api.GetCommand{Command: refresh.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	if g := computetest.Count(t, p.DB.Pool, `SELECT generation FROM compute.node_desired WHERE node_id = $1`, node.NodeID()); g != int(gen+1) {
		t.Fatalf("an inventory refresh moved the generation to %d", g)
	}
	if g := node.Converger.Last().GetGeneration(); g != gen+1 {
		t.Fatalf("the node holds generation %d after an inventory refresh, want %d", g, gen+1)
	}
}
