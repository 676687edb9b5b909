package iam

import (
	"strings"
	"testing"
)

func TestMatchGlob(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "compute:pools:create", true},
		{"compute:pools:*", "compute:pools:create", true},
		{"compute:pools:*", "compute:poolsx:create", false},
		{"compute:*:get", "compute:pools:get", true},
		{"compute:*:get", "compute:pools:getx", false},
		{"compute:pools:?et", "compute:pools:get", true},
		{"compute:pools:?et", "compute:pools:et", false},
		{"compute-pool/*", "compute-pool/0192", true},
		{"compute-pool/*", "compute-site/0192", false},
		{"a*b*c", "abbbc", true},
		{"a*b*c", "acb", false},
		{"", "", true},
		{"", "a", false},
		{"exact", "exact", true},
		{"exact", "exactly", false},
	}
	for _, c := range cases {
		if got := matchGlob(c.pattern, c.s); got != c.want {
			t.Errorf("matchGlob(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

func TestEvaluate(t *testing.T) {
	pols := []namedPolicy{
		{"ops", Policy{Version: 1, Statements: []Statement{
			{Sid: "pools", Effect: Allow, Actions: []string{"compute:pools:*"}, Resources: []string{"compute-pool/*"}},
			{Sid: "no-delete-prod", Effect: Deny, Actions: []string{"compute:pools:delete"}, Resources: []string{"compute-pool/prod"}},
		}}},
	}
	req := func(action, id string) Request {
		return Request{TenantID: "t", Action: action, Resource: Resource{Type: "compute-pool", ID: id}}
	}
	if d := evaluate(pols, req("compute:pools:create", "*")); !d.Allowed || d.Matched != "ops/pools" {
		t.Errorf("create = %+v, want allowed by ops/pools", d)
	}
	if d := evaluate(pols, req("compute:pools:delete", "prod")); d.Allowed || d.Matched != "ops/no-delete-prod" {
		t.Errorf("delete prod = %+v, want the explicit deny to win", d)
	}
	if d := evaluate(pols, req("compute:sites:create", "*")); d.Allowed || !strings.Contains(d.Reason, "no policy allows") {
		t.Errorf("sites create = %+v, want a default deny", d)
	}
	if d := evaluate(nil, req("compute:pools:get", "x")); d.Allowed {
		t.Errorf("no policies allowed %+v", d)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	cases := map[string]string{
		"not JSON":      `{`,
		"version":       `{"version": 2, "statements": []}`,
		"effect":        `{"version": 1, "statements": [{"effect": "maybe", "actions": ["*"], "resources": ["*"]}]}`,
		"no actions":    `{"version": 1, "statements": [{"effect": "allow", "resources": ["*"]}]}`,
		"no resources":  `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"]}]}`,
		"bad resource":  `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["pools"]}]}`,
		"unknown field": `{"version": 1, "statements": [], "extra": true}`,
		"conditions":    `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": {"Bool": {"x": true}}}]}`,
	}
	for name, doc := range cases {
		if _, err := ParsePolicy([]byte(doc)); err == nil {
			t.Errorf("%s: ParsePolicy(%s) succeeded", name, doc)
		}
	}
	if _, err := ParsePolicy([]byte(`{"version": 1, "statements": [{"sid": "a", "effect": "deny", "actions": ["compute:*"], "resources": ["compute-pool/*"]}]}`)); err != nil {
		t.Errorf("a valid policy: %v", err)
	}
}

func FuzzParsePolicy(f *testing.F) {
	f.Add(`{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"]}]}`)
	f.Add(`{"version": 1}`)
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := ParsePolicy([]byte(doc))
		if err != nil {
			return
		}
		// Whatever parses must evaluate without panicking.
		evaluate([]namedPolicy{{"f", p}}, Request{Action: "compute:pools:get", Resource: Resource{Type: "compute-pool", ID: "x"}})
	})
}
