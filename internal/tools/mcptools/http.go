package mcptools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/better-compute/compute/client"
)

// SessionIdle is how long an HTTP session may go without a request before it is closed, so that
// agents that vanish do not hold sessions (and their keys' clients) forever.
const SessionIdle = 30 * time.Minute

// HTTPHandler serves the tools over streamable HTTP to many agents, each with its own key. Every
// request must carry `Authorization: Bearer <API key>`; that key is the credential of every call
// its session makes, so the server itself holds no rights. A request without one is refused with
// 401, and a session answers only requests that carry the key that opened it (403 otherwise).
// newClient makes the API client of one key.
func HTTPHandler(newClient func(key string) (*client.Client, error), version string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		key, _ := bearer(r)
		cl, err := newClient(key)
		if err != nil {
			return nil // the SDK answers 400
		}
		s, err := New(r.Context(), cl, version)
		if err != nil {
			return nil
		}
		return s
	}, &mcp.StreamableHTTPOptions{SessionTimeout: SessionIdle})
	// The SDK's middleware records who opened a session and refuses its id with another key. The
	// "user" is a hash of the key, so the key itself is kept nowhere but in the session's client.
	verified := auth.RequireBearerToken(func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		sum := sha256.Sum256([]byte(token))
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:])}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := bearer(r); !ok {
			unauthenticated(w)
			return
		}
		verified.ServeHTTP(w, r)
	})
}

// bearer is the request's bearer token, by the same rule as the SDK's middleware (two fields,
// the first "Bearer" in any case), so that what passes here passes there.
func bearer(r *http.Request) (string, bool) {
	f := strings.Fields(r.Header.Get("Authorization"))
	if len(f) != 2 || !strings.EqualFold(f[0], "bearer") {
		return "", false
	}
	return f[1], true
}

// unauthenticated answers 401 with a JSON-RPC error an MCP client can show: what is missing and
// what to send.
func unauthenticated(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="better-compute"`)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"jsonrpc": "2.0", "id": nil,
		"error": map[string]any{
			"code":    -32001,
			"message": "unauthenticated: send Authorization: Bearer <API key>; the key is the credential of every call this session makes",
			"data":    map[string]any{"code": "unauthenticated"},
		},
	})
}
