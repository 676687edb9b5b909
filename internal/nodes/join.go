package nodes

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/internal/capacity"
	"github.com/better-compute/compute/internal/events"
	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/internal/pki"
)

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)

// Join admits a machine: the join token is spent (one use), the node is created in the token's
// pool (or, for the same machine joining again under the same name, taken over), and a client
// certificate is issued for the CSR's key. A refused join creates nothing and spends nothing.
func (m *Module) Join(ctx context.Context, req *agentv1.JoinRequest) (*agentv1.JoinResponse, error) {
	rt, err := m.Runtime()
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	auth, _ := m.Authority()
	if req.GetToken() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("token: is required"))
	}
	csr, err := x509.ParseCertificateRequest(req.GetCsrDer())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("csr_der: not a DER certificate request: %w", err))
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("csr_der: its signature does not verify: %w", err))
	}
	facts := req.GetFacts()
	name := strings.ToLower(facts.GetHostname())
	if !nodeNameRE.MatchString(name) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("facts.hostname: %q is not a usable node name (letters, digits and '._-')", facts.GetHostname()))
	}
	var resp *agentv1.JoinResponse
	err = rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var pool, tenant string
		err := tx.QueryRow(ctx, `UPDATE compute.join_tokens SET uses_left = uses_left - 1
			WHERE token_hash = $1 AND uses_left > 0 AND revoked_at IS NULL AND expires_at > compute.compute_now()
			RETURNING pool_id::text, tenant_id`, hashToken(req.GetToken())).Scan(&pool, &tenant)
		if errors.Is(err, pgx.ErrNoRows) {
			return connect.NewError(connect.CodeUnauthenticated, joinError(ctx, tx, req.GetToken()))
		}
		if err != nil {
			return err
		}
		nodeID, err := admit(ctx, tx, pool, name, facts)
		if err != nil {
			return err
		}
		der, notAfter, err := auth.IssueNode(ctx, tx, nodeID, req.GetCsrDer(), m.cfg.CertLifetime)
		if err != nil {
			return connect.NewError(connect.CodeInvalidArgument, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO compute.node_desired (node_id) VALUES ($1) ON CONFLICT DO NOTHING`, nodeID); err != nil {
			return err
		}
		if err := capacity.RefreshNodes(ctx, tx, nodeID); err != nil {
			return err
		}
		if err := events.Emit(ctx, tx, "node.joined", tenant, nodeID, map[string]any{"pool": pool, "name": name}); err != nil {
			return err
		}
		resp = &agentv1.JoinResponse{
			NodeId: nodeID, NodeName: name, CertificateDer: der,
			CaCertificatesDer: [][]byte{auth.Certificate().Raw},
			NotAfter:          timestamppb.New(notAfter), GatewayAddresses: m.cfg.GatewayAddresses,
		}
		return nil
	})
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		rt.Logger.ErrorContext(ctx, "nodes: join failed", "error", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("join failed; the server log has the detail"))
	}
	return resp, nil
}

// admit creates the node, or takes over the node of the same name when it is the same machine
// (same machine id) joining again, e.g. after losing its journal: its old certificates are revoked.
func admit(ctx context.Context, tx pgx.Tx, pool, name string, facts *agentv1.MachineFacts) (string, error) {
	var id, state, machine string
	err := tx.QueryRow(ctx, `SELECT id::text, state, coalesce(facts->>'machineId', '') FROM compute.nodes WHERE pool_id = $1 AND name = $2 FOR UPDATE`, pool, name).
		Scan(&id, &state, &machine)
	factMap := map[string]any{"hostname": facts.GetHostname(), "machineId": facts.GetMachineId(), "os": facts.GetOs(),
		"kernel": facts.GetKernel(), "arch": facts.GetArch(), "agentVersion": facts.GetAgentVersion()}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		n, err := fleet.InsertNode(ctx, tx, fleet.NewNode{PoolID: pool, Name: name, Facts: factMap})
		return n.ID, err
	case err != nil:
		return "", err
	case state == "retired" || machine == "" || machine != facts.GetMachineId():
		return "", connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("the pool already has a node named %q (a different machine, or retired); give this machine another hostname", name))
	}
	if _, err := pki.RevokeNode(ctx, tx, id); err != nil {
		return "", err
	}
	_, err = tx.Exec(ctx, `UPDATE compute.nodes SET facts = $2, updated_at = compute.compute_now() WHERE id = $1`, id, factMap)
	return id, err
}
