package iam

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Effect is what a statement does when it matches.
type Effect string

// The effects. An explicit deny wins over any allow.
const (
	Allow Effect = "allow"
	Deny  Effect = "deny"
)

// Policy is a Better IAM policy document.
type Policy struct {
	Version    int         `json:"version"`
	Statements []Statement `json:"statements"`
}

// Statement allows or denies actions on resources. Actions and resources are anchored globs
// (compute:pools:*, compute-pool/*).
type Statement struct {
	Sid        string         `json:"sid,omitempty"`
	Effect     Effect         `json:"effect"`
	Actions    []string       `json:"actions"`
	Resources  []string       `json:"resources"`
	Conditions map[string]any `json:"conditions,omitempty"`
}

// ParsePolicy decodes and checks a policy document.
func ParsePolicy(doc []byte) (Policy, error) {
	var p Policy
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Policy{}, fmt.Errorf("policy: %w", err)
	}
	return p, p.Validate()
}

// Validate checks a policy: version 1, and every statement with an effect, actions and resources.
func (p Policy) Validate() error {
	if p.Version != 1 {
		return fmt.Errorf("policy: version must be 1, got %d", p.Version)
	}
	for i, s := range p.Statements {
		where := fmt.Sprintf("policy: statement %d", i)
		if s.Sid != "" {
			where += fmt.Sprintf(" (%s)", s.Sid)
		}
		if s.Effect != Allow && s.Effect != Deny {
			return fmt.Errorf("%s: effect must be allow or deny, got %q", where, s.Effect)
		}
		if len(s.Actions) == 0 {
			return fmt.Errorf("%s: no actions", where)
		}
		if len(s.Resources) == 0 {
			return fmt.Errorf("%s: no resources", where)
		}
		for _, a := range s.Actions {
			if a == "" || strings.ContainsAny(a, " \t\n") {
				return fmt.Errorf("%s: action %q is not a pattern", where, a)
			}
		}
		for _, r := range s.Resources {
			if r != "*" && !strings.Contains(r, "/") {
				return fmt.Errorf("%s: resource %q must be written type/id (or *)", where, r)
			}
		}
		if err := checkConditions(s.Conditions); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// Attributes are what conditions and ${variables} of a decision can refer to: principal.*,
// request.*, resource.* and the request's context.
func Attributes(p Principal, r Request, resource map[string]any) map[string]any {
	a := map[string]any{
		"principal.id": p.ID, "principal.kind": string(p.Kind), "principal.tenantId": p.TenantID, "principal.name": p.Name,
		"request.tenantId": r.TenantID, "request.action": r.Action, "request.time": time.Now().UTC().Format(time.RFC3339Nano),
		"resource.type": r.Resource.Type, "resource.id": r.Resource.ID,
	}
	for k, v := range resource {
		a["resource."+k] = v
	}
	for k, v := range r.Context {
		a[k] = v
	}
	return a
}

// evaluate decides r against the statements of named policies: an explicit deny wins, then any
// allow; no match is a deny. Patterns and condition values may use ${variables} of attrs.
func evaluate(policies []namedPolicy, r Request, attrs map[string]any) Decision {
	res := r.Resource.String()
	var allow *Decision
	for _, np := range policies {
		for _, s := range np.policy.Statements {
			if !anyMatchExpanded(s.Actions, r.Action, attrs) || !anyMatchExpanded(s.Resources, res, attrs) {
				continue
			}
			if len(s.Conditions) > 0 {
				ok, err := conditionsHold(s.Conditions, attrs)
				if err != nil || !ok {
					continue
				}
			}
			matched := np.name
			if s.Sid != "" {
				matched += "/" + s.Sid
			}
			if s.Effect == Deny {
				return Decision{Allowed: false, Reason: "explicitly denied", Matched: matched}
			}
			if allow == nil {
				allow = &Decision{Allowed: true, Reason: "allowed", Matched: matched}
			}
		}
	}
	if allow != nil {
		return *allow
	}
	return Decision{Allowed: false, Reason: "no policy allows " + r.Action + " on " + res}
}

type namedPolicy struct {
	id     string
	name   string
	policy Policy
}

func anyMatchExpanded(patterns []string, s string, attrs map[string]any) bool {
	for _, p := range patterns {
		if matchGlob(expand(p, attrs), s) {
			return true
		}
	}
	return false
}

func anyMatch(patterns []string, s string) bool {
	for _, p := range patterns {
		if matchGlob(p, s) {
			return true
		}
	}
	return false
}
