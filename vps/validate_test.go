package vps

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
)

// TestListInputsCheckTheirPage: every list input of the module checks its page (a limit out of
// range, a cursor too long) as well as its own fields, whatever else it embeds.
func TestListInputsCheckTheirPage(t *testing.T) {
	t.Parallel()
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

// TestSandboxTTLsAreAtLeastASecond: any ttl a create or an extension gives is accepted only when
// it is a second or more, and otherwise refused naming ttl (a sandbox that expired as it was
// made, or on its extension, was accepted before).
func TestSandboxTTLsAreAtLeastASecond(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		d := time.Duration(rapid.Int64Range(1, int64(3*time.Second)).Draw(rt, "ttl"))
		for name, err := range map[string]error{
			"sandboxes.create": CreateSandbox{Template: "t", TTL: d.String()}.Validate(),
			"sandboxes.extend": ExtendSandbox{SandboxRef: SandboxRef{Sandbox: "s"}, TTL: d.String()}.Validate(),
		} {
			switch {
			case d >= time.Second && err != nil:
				rt.Fatalf("%s with ttl %s: %v", name, d, err)
			case d < time.Second && (api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "ttl")):
				rt.Fatalf("%s with ttl %s: %v, want invalid_argument naming ttl", name, d, err)
			}
		}
	})
}
