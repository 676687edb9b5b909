package iam

import (
	"fmt"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Condition operators of Better IAM policies. A statement's conditions are
// {operator: {key: value}}: every operator must hold, for every key; a list of values holds when
// any of them does. A key the request does not have fails every operator but Exists.
var operators = map[string]func(have any, want any) (bool, error){
	"StringEquals":             func(h, w any) (bool, error) { return str(h) == str(w), nil },
	"StringNotEquals":          func(h, w any) (bool, error) { return str(h) != str(w), nil },
	"StringLike":               func(h, w any) (bool, error) { return matchGlob(str(w), str(h)), nil },
	"StringNotLike":            func(h, w any) (bool, error) { return !matchGlob(str(w), str(h)), nil },
	"Bool":                     boolEquals,
	"NumericEquals":            numeric(func(a, b float64) bool { return a == b }),
	"NumericNotEquals":         numeric(func(a, b float64) bool { return a != b }),
	"NumericLessThan":          numeric(func(a, b float64) bool { return a < b }),
	"NumericLessThanEquals":    numeric(func(a, b float64) bool { return a <= b }),
	"NumericGreaterThan":       numeric(func(a, b float64) bool { return a > b }),
	"NumericGreaterThanEquals": numeric(func(a, b float64) bool { return a >= b }),
	"DateBefore":               date(func(a, b time.Time) bool { return a.Before(b) }),
	"DateAfter":                date(func(a, b time.Time) bool { return a.After(b) }),
	"IpAddress":                ipIn(true),
	"NotIpAddress":             ipIn(false),
	"ArrayContains":            arrayContains,
	"Exists":                   nil, // handled on its own: it is about the key, not a value
}

// checkConditions validates a statement's conditions when a policy is parsed.
func checkConditions(c map[string]any) error {
	for op, raw := range c {
		if _, ok := operators[op]; !ok {
			return fmt.Errorf("unknown condition operator %q", op)
		}
		keys, ok := raw.(map[string]any)
		if !ok || len(keys) == 0 {
			return fmt.Errorf("condition %s must map keys to values", op)
		}
		for k, v := range keys {
			if k == "" {
				return fmt.Errorf("condition %s has an empty key", op)
			}
			for _, one := range values(v) {
				if err := checkValue(op, one); err != nil {
					return fmt.Errorf("condition %s %s: %w", op, k, err)
				}
			}
		}
	}
	return nil
}

func checkValue(op string, v any) error {
	switch {
	case op == "Exists" || op == "Bool":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%v is not true or false", v)
		}
	case strings.HasPrefix(op, "Numeric"):
		if _, ok := num(v); !ok {
			return fmt.Errorf("%v is not a number", v)
		}
	case strings.HasPrefix(op, "Date"):
		if _, ok := when(v); !ok {
			return fmt.Errorf("%v is not an RFC 3339 time", v)
		}
	case strings.HasSuffix(op, "IpAddress"):
		if _, err := netip.ParsePrefix(str(v)); err != nil {
			if _, err := netip.ParseAddr(str(v)); err != nil {
				return fmt.Errorf("%v is not an address or a CIDR block", v)
			}
		}
	}
	return nil
}

// conditionsHold evaluates conditions against the request's attributes, variables expanded.
func conditionsHold(c map[string]any, attrs map[string]any) (bool, error) {
	for op, raw := range c {
		keys, _ := raw.(map[string]any)
		for k, v := range keys {
			have, present := attrs[k]
			if op == "Exists" {
				want, _ := v.(bool)
				if present != want {
					return false, nil
				}
				continue
			}
			if !present {
				return false, nil
			}
			any := false
			for _, w := range values(v) {
				if s, ok := w.(string); ok {
					w = expand(s, attrs)
				}
				ok, err := operators[op](have, w)
				if err != nil {
					return false, err
				}
				if ok {
					any = true
					break
				}
			}
			if !any {
				return false, nil
			}
		}
	}
	return true, nil
}

// expand replaces ${key} with the attribute's value; an unknown key expands to nothing, which
// then matches nothing it should not.
func expand(s string, attrs map[string]any) string {
	if !strings.Contains(s, "${") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		j := strings.Index(s[i:], "}")
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		if v, ok := attrs[s[i+2:i+j]]; ok {
			b.WriteString(str(v))
		} else {
			b.WriteString("\x00") // matches no character of a real value
		}
		s = s[i+j+1:]
	}
}

func values(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

func num(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

func when(v any) (time.Time, bool) {
	switch x := v.(type) {
	case time.Time:
		return x, true
	case string:
		t, err := time.Parse(time.RFC3339, x)
		return t, err == nil
	}
	return time.Time{}, false
}

func numeric(f func(a, b float64) bool) func(any, any) (bool, error) {
	return func(h, w any) (bool, error) {
		a, ok1 := num(h)
		b, ok2 := num(w)
		return ok1 && ok2 && f(a, b), nil
	}
}

func date(f func(a, b time.Time) bool) func(any, any) (bool, error) {
	return func(h, w any) (bool, error) {
		a, ok1 := when(h)
		b, ok2 := when(w)
		return ok1 && ok2 && f(a, b), nil
	}
}

func boolEquals(h, w any) (bool, error) {
	hb, ok := h.(bool)
	if !ok {
		hb = str(h) == "true"
	}
	wb, _ := w.(bool)
	return hb == wb, nil
}

func ipIn(in bool) func(any, any) (bool, error) {
	return func(h, w any) (bool, error) {
		addr, err := netip.ParseAddr(str(h))
		if err != nil {
			return false, nil
		}
		p, err := netip.ParsePrefix(str(w))
		if err != nil {
			a, err := netip.ParseAddr(str(w))
			if err != nil {
				return false, nil
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		return p.Contains(addr.Unmap()) == in, nil
	}
}

func arrayContains(h, w any) (bool, error) {
	v := reflect.ValueOf(h)
	if v.Kind() != reflect.Slice {
		return false, nil
	}
	for i := range v.Len() {
		if str(v.Index(i).Interface()) == str(w) {
			return true, nil
		}
	}
	return false, nil
}
