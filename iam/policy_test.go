package iam

import (
	"strings"
	"testing"
)

func TestMatchGlob(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	pols := []namedPolicy{
		{name: "ops", policy: Policy{Version: 1, Statements: []Statement{
			{Sid: "pools", Effect: Allow, Actions: []string{"compute:pools:*"}, Resources: []string{"compute-pool/*"}},
			{Sid: "no-delete-prod", Effect: Deny, Actions: []string{"compute:pools:delete"}, Resources: []string{"compute-pool/prod"}},
		}}},
	}
	req := func(action, id string) Request {
		return Request{TenantID: "t", Action: action, Resource: Resource{Type: "compute-pool", ID: id}}
	}
	if d := evaluate(pols, req("compute:pools:create", "*"), nil); !d.Allowed || d.Matched != "ops/pools" {
		t.Errorf("create = %+v, want allowed by ops/pools", d)
	}
	if d := evaluate(pols, req("compute:pools:delete", "prod"), nil); d.Allowed || d.Matched != "ops/no-delete-prod" {
		t.Errorf("delete prod = %+v, want the explicit deny to win", d)
	}
	if d := evaluate(pols, req("compute:sites:create", "*"), nil); d.Allowed || !strings.Contains(d.Reason, "no policy allows") {
		t.Errorf("sites create = %+v, want a default deny", d)
	}
	if d := evaluate(nil, req("compute:pools:get", "x"), nil); d.Allowed {
		t.Errorf("no policies allowed %+v", d)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"not JSON":         `{`,
		"version":          `{"version": 2, "statements": []}`,
		"effect":           `{"version": 1, "statements": [{"effect": "maybe", "actions": ["*"], "resources": ["*"]}]}`,
		"no actions":       `{"version": 1, "statements": [{"effect": "allow", "resources": ["*"]}]}`,
		"no resources":     `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"]}]}`,
		"bad resource":     `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["pools"]}]}`,
		"unknown field":    `{"version": 1, "statements": [], "extra": true}`,
		"unknown operator": `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": {"Maybe": {"x": true}}}]}`,
		"Bool not a bool":  `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": {"Bool": {"x": "yes"}}}]}`,
		"bad CIDR":         `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": {"IpAddress": {"request.ip": "10.0.0.0/99"}}}]}`,
		"bad date":         `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": {"DateBefore": {"request.time": "soon"}}}]}`,
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
	f.Add(`{"version": 1, "statements": [{"effect": "allow", "actions": ["compute:${principal.kind}:*"], "resources": ["compute-pool/${principal.id}-?"],
		"conditions": {"IpAddress": {"request.ip": "10.0.0.0/8"}, "NumericLessThan": {"request.n": 3}, "DateBefore": {"request.time": "2100-01-01T00:00:00Z"},
		"ArrayContains": {"request.tags": "a"}, "Bool": {"request.mfa": true}, "Exists": {"request.x": true}, "StringLike": {"principal.id": "idn_*"}}}]}`)
	attrs := map[string]any{"principal.id": "idn_1", "principal.kind": "service", "request.ip": "10.1.2.3", "request.n": 2,
		"request.time": "2026-12-02T00:00:00Z", "request.tags": []any{"a"}, "request.mfa": true, "request.x": "y"}
	f.Fuzz(func(t *testing.T, doc string) {
		p, err := ParsePolicy([]byte(doc))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		// Whatever parses must evaluate without panicking, with and without attributes.
		r := Request{Action: "compute:pools:get", Resource: Resource{Type: "compute-pool", ID: "idn_1-a"}}
		evaluate([]namedPolicy{{name: "f", policy: p}}, r, nil)
		evaluate([]namedPolicy{{name: "f", policy: p}}, r, attrs)
	})
}

func TestConditionOperatorsAndVariables(t *testing.T) {
	t.Parallel()
	attrs := map[string]any{
		"principal.id": "idn_1", "principal.kind": "service", "request.ip": "10.1.2.3",
		"request.time": "2030-01-01T00:00:00Z", "resource.gpus": float64(8), "resource.labels": []any{"prod", "eu"},
		"resource.owner": "idn_1", "resource.spot": true,
	}
	cases := []struct {
		cond string
		want bool
	}{
		{`{"StringEquals": {"principal.kind": "service"}}`, true},
		{`{"StringEquals": {"principal.kind": ["user", "agent"]}}`, false},
		{`{"StringNotEquals": {"principal.kind": "user"}}`, true},
		{`{"StringLike": {"principal.id": "idn_*"}}`, true},
		{`{"StringNotLike": {"principal.id": "idn_*"}}`, false},
		{`{"Bool": {"resource.spot": true}}`, true},
		{`{"Bool": {"resource.spot": false}}`, false},
		{`{"NumericLessThan": {"resource.gpus": 9}}`, true},
		{`{"NumericLessThan": {"resource.gpus": 8}}`, false},
		{`{"NumericLessThanEquals": {"resource.gpus": 8}}`, true},
		{`{"NumericGreaterThan": {"resource.gpus": 4}}`, true},
		{`{"NumericEquals": {"resource.gpus": 8}}`, true},
		{`{"DateBefore": {"request.time": "2031-01-01T00:00:00Z"}}`, true},
		{`{"DateAfter": {"request.time": "2031-01-01T00:00:00Z"}}`, false},
		{`{"IpAddress": {"request.ip": "10.0.0.0/8"}}`, true},
		{`{"IpAddress": {"request.ip": "192.168.0.0/16"}}`, false},
		{`{"NotIpAddress": {"request.ip": "192.168.0.0/16"}}`, true},
		{`{"ArrayContains": {"resource.labels": "prod"}}`, true},
		{`{"ArrayContains": {"resource.labels": "us"}}`, false},
		{`{"Exists": {"resource.owner": true}}`, true},
		{`{"Exists": {"resource.nothing": true}}`, false},
		{`{"Exists": {"resource.nothing": false}}`, true},
		{`{"StringEquals": {"resource.nothing": "x"}}`, false},
		{`{"StringEquals": {"resource.owner": "${principal.id}"}}`, true},
		{`{"StringEquals": {"resource.owner": "${principal.kind}"}}`, false},
		{`{"StringEquals": {"principal.kind": "service"}, "NumericLessThan": {"resource.gpus": 2}}`, false},
	}
	for _, c := range cases {
		doc := `{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["*"], "conditions": ` + c.cond + `}]}`
		p, err := ParsePolicy([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", c.cond, err)
		}
		d := evaluate([]namedPolicy{{name: "p", policy: p}}, Request{Action: "compute:pools:get", Resource: Resource{Type: "compute-pool", ID: "x"}}, attrs)
		if d.Allowed != c.want {
			t.Errorf("%s: allowed %v, want %v", c.cond, d.Allowed, c.want)
		}
	}
	// A variable in a resource pattern: only what the caller owns.
	p, _ := ParsePolicy([]byte(`{"version": 1, "statements": [{"effect": "allow", "actions": ["*"], "resources": ["compute-reservation/${principal.id}-*"]}]}`))
	for id, want := range map[string]bool{"idn_1-a": true, "idn_2-a": false} {
		d := evaluate([]namedPolicy{{name: "p", policy: p}}, Request{Action: "x", Resource: Resource{Type: "compute-reservation", ID: id}}, attrs)
		if d.Allowed != want {
			t.Errorf("resource %s: allowed %v, want %v", id, d.Allowed, want)
		}
	}
}
