package vps

import (
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
)

// TestListInputsCheckTheirPage: every list input of the module checks its page (a limit out of
// range, a cursor too long) as well as its own fields, whatever else it embeds.
func TestListInputsCheckTheirPage(t *testing.T) {
	bad := []api.PageRequest{{Limit: -1}, {Limit: api.MaxPageLimit + 1}, {Cursor: strings.Repeat("x", 513)}}
	for _, page := range bad {
		for name, in := range map[string]interface{ Validate() error }{
			"ListInstances":         ListInstances{PageRequest: page},
			"ListSandboxes":         ListSandboxes{PageRequest: page},
			"ListSnapshots":         ListSnapshots{SandboxRef: SandboxRef{Sandbox: "s"}, PageRequest: page},
			"ListProviderInstances": ListProviderInstances{PageRequest: page},
			"ListAddresses":         ListAddresses{Network: "n", PageRequest: page},
		} {
			err := in.Validate()
			if api.CodeOf(err) != api.CodeInvalidArgument || !(strings.Contains(err.Error(), "limit") || strings.Contains(err.Error(), "cursor")) {
				t.Errorf("%s with %+v: %v, want invalid_argument naming limit or cursor", name, page, err)
			}
		}
	}
	if err := (ListSnapshots{}).Validate(); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "sandbox") {
		t.Errorf("ListSnapshots without a sandbox: %v", err)
	}
}
