package agentv1

// ProtocolVersion is the version of the node protocol this package describes. It changes only
// with a change that an agent or a gateway of the previous version cannot take (a field or
// message removed, renumbered or retyped); additions keep it. agent/v1/surface.txt is the
// protocol's surface at this version, and TestProtocolSurface (internal/tools/surface) fails when the
// protocol changes in a breaking way without it changing (docs/compatibility.md).
const ProtocolVersion = 1

// TunnelWindow is how many bytes of a tunnel's output may be sent and not yet acknowledged
// (TunnelAck): both ends hold to it, so that a holder that reads slowly slows its command, not the
// node's session.
const TunnelWindow = 256 << 10

// The WebSocket transport of SessionService.Connect, for where gRPC (HTTP/2) cannot get
// through: the same session, each NodeMessage and ServerMessage one binary WebSocket message
// (its protobuf encoding), over the same mutual TLS, on the gateway's listener.
const (
	// SessionWebSocketPath is where a gateway accepts sessions over a WebSocket.
	SessionWebSocketPath = "/agent.v1.SessionService/WebSocket"
	// SessionWebSocketProtocol is the WebSocket subprotocol of a session, which both sides name.
	SessionWebSocketProtocol = "agent.v1.session"
	// WebSocketCloseBase is added to a gRPC status code (1 to 16) to make the WebSocket close
	// status a session ends with when the session service refuses or ends it (4007: permission
	// denied, which a node takes as final; 4014: unavailable, retried), so that a node reads
	// the same codes over either transport. A session that ends normally closes with 1000.
	WebSocketCloseBase = 4000
)
