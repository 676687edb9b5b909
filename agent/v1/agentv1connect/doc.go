// Package agentv1connect is the node protocol (package agentv1) for connect-go, generated from
// agent.proto by generate.sh: the handlers the control plane mounts (JoinService behind
// Compute.JoinHandler, SessionService in the gateway's NodeHandler) and the JoinService client a
// node joins with.
package agentv1connect
