// Package agentv1 is the node protocol between bcd and the control plane, generated from
// agent.proto (agent.pb.go, agent_grpc.pb.go; regenerate with generate.sh): JoinService, which a
// node calls once with a join credential and a CSR to get its certificate, and SessionService,
// whose one bidirectional stream (Connect) carries heartbeats, inventory, health, desired state,
// commands and their results behind mutual TLS.
//
// Start with agent.proto; transport.go holds the hand-written part (ProtocolVersion, the
// WebSocket fallback's constants). surface.txt is the protocol's recorded surface, which a
// breaking change must bump ProtocolVersion to change (docs/compatibility.md). The Connect
// handlers and clients are in agentv1connect; the control plane's side is internal/core/gateway
// and internal/core/nodes, the node's internal/node/nodeagent.
package agentv1
