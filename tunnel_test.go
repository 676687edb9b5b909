package compute_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
)

// TestTunnelEndpointRefusals: the tunnel endpoint answers every request it cannot serve with the
// error envelope and a reason, and a ticket spent on a node this process holds no session of is
// spent (it opens nothing later either).
func TestTunnelEndpointRefusals(t *testing.T) {
	t.Parallel()
	ff := newFuzzFleet(t)
	env := ff.env
	url := env.Server(t)
	ctx := context.Background()
	ticket, err := env.Compute.API.Access.Exec(ctx, env.RootKey, api.OpenTunnel{Node: ff.nodeID, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ticket.URL, api.BasePath+api.TunnelPath+"?ticket=bctun_") || ticket.Node != ff.nodeID {
		t.Fatalf("ticket = %+v", ticket)
	}
	for _, c := range []struct {
		name, method, query string
		status              int
		reason              string
	}{
		{"post", http.MethodPost, "?ticket=" + ticket.Ticket, 405, "method_not_allowed"},
		{"no ticket", http.MethodGet, "", 401, "ticket"},
		{"not a ticket", http.MethodGet, "?ticket=hello", 401, "ticket"},
		{"unknown ticket", http.MethodGet, "?ticket=bctun_AAAAAAAA", 401, "ticket"},
		{"no session", http.MethodGet, "?ticket=" + ticket.Ticket, 503, "no_session"},
		{"spent", http.MethodGet, "?ticket=" + ticket.Ticket, 401, "ticket"},
	} {
		req, _ := http.NewRequest(c.method, url+api.BasePath+api.TunnelPath+c.query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body api.ErrorBody
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || body.Error == nil || body.Error.Details["reason"] != c.reason {
			t.Errorf("%s: %d %+v (%v), want %d reason %s", c.name, resp.StatusCode, body.Error, err, c.status, c.reason)
		}
	}
	var n int
	if err := env.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM compute.events WHERE type = 'access.exec' AND subject = $1`, ff.nodeID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("access.exec events = %d, %v", n, err)
	}
}
