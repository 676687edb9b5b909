package redfish_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/better-compute/compute/metal/power"
	"github.com/better-compute/compute/metal/redfish"
	"github.com/better-compute/compute/netpolicy"
)

// TestConnectionsGoThroughTheBMCsDial: with BMC.Dial set (the control plane's outbound policy)
// every connection is the dial's, so a refused address is never reached; an error answer is
// told by its status, its body kept for the operator (netpolicy.Detail).
func TestConnectionsGoThroughTheBMCsDial(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	never := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("a refused address was reached") }))
	defer never.Close()
	var strict *netpolicy.Policy
	_, err := redfish.Driver{}.State(ctx, power.BMC{Address: never.URL, Username: "admin", Password: "pw", Dial: strict.DialContext})
	var refused *netpolicy.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("a BMC on loopback under the default policy: %v, want refused", err)
	}

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"internal-secret"}}`, http.StatusInternalServerError)
	}))
	defer failing.Close()
	loopback, _ := netpolicy.New([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	_, err = redfish.Driver{}.State(ctx, power.BMC{Address: failing.URL, Username: "admin", Password: "pw", Dial: loopback.DialContext})
	if err == nil || !strings.Contains(err.Error(), "HTTP 500") || strings.Contains(err.Error(), "internal-secret") || !strings.Contains(netpolicy.Detail(err), "internal-secret") {
		t.Errorf("a failing BMC: %v (detail %s), want its status, its body in the detail alone", err, netpolicy.Detail(err))
	}
}
