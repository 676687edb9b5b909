package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"

	"github.com/better-compute/compute/api"
)

// terminalSafe: whether text holds nothing a terminal would act on: no C0 control but the
// newline, no DEL, no C1 control, no line separator or bidi control, and only UTF-8.
func terminalSafe(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r != '\n' && unsafeRune(r) {
			return false
		}
	}
	return true
}

// TestPrintedTextIsTerminalSafe: whatever text an answer or an error holds (a tenant's display
// name with ESC sequences, invalid UTF-8 in an error), no output format for people passes a
// control character through, a table keeps a row per item, and JSON and YAML still carry the
// text exactly.
func TestPrintedTextIsTerminalSafe(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		controls := rapid.SampledFrom([]rune{0x1b, 0x7f, 0x85, 0x9b, '\t', '\n', '\r', 0x2028, 0x202e, 0, '[', '\\'})
		text := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.OneOf(rapid.Rune(), controls))).Draw(t, "text")
		other := rapid.String().Draw(t, "other")
		item := map[string]any{"id": text, "name": text, "state": other, "labels": map[string]string{text: text},
			"tags": []string{text, other}, "allocations": []any{map[string]any{"node": text, "gpus": []any{map[string]any{"uuid": text, "index": 0}}}},
			// keys of a tenant's making: nested objects under them, and list items' fields
			"meta": map[string]any{text: map[string]any{"k": text}}, "parts": []any{map[string]any{text: other, "items": []any{map[string]any{text: 1}}}}}
		event := map[string]any{"id": 7, "type": text, "subject": text, "createdAt": other, "data": map[string]any{"k": text}}
		answers := []any{item, []any{item, item}, map[string]any{"items": []any{item, item}, "nextCursor": text},
			map[string]any{"items": []any{event}}, text, []any{text}}
		for _, a := range answers {
			raw, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			for _, format := range []string{"table", "wide"} {
				var out bytes.Buffer
				if err := render(&out, format, raw); err != nil {
					t.Fatalf("-o %s of %s: %v", format, raw, err)
				}
				if !terminalSafe(out.String()) {
					t.Fatalf("-o %s of %s printed %q", format, raw, out.String())
				}
				if page, ok := a.(map[string]any); ok && page["items"] != nil {
					// a header, a line per item, and the cursor's after a blank line
					want := 1 + len(page["items"].([]any))
					if next, _ := page["nextCursor"].(string); next != "" {
						want += 2
					}
					if lines := strings.Count(out.String(), "\n"); lines != want {
						t.Fatalf("-o %s of %s: %d lines, want %d\n%s", format, raw, lines, want, out.String())
					}
				}
			}
			var j bytes.Buffer
			if err := render(&j, "json", raw); err != nil {
				t.Fatal(err)
			}
			var back any
			if err := json.Unmarshal(j.Bytes(), &back); err != nil || !terminalSafe(j.String()) {
				t.Fatalf("-o json of %s printed %q (%v)", raw, j.String(), err)
			}
			want, _ := json.Marshal(a)
			if got, _ := json.Marshal(back); !bytes.Equal(got, want) {
				t.Fatalf("-o json changed the answer: %s, want %s", got, want)
			}
			var y bytes.Buffer
			if err := render(&y, "yaml", raw); err != nil {
				t.Fatal(err)
			}
			var fromYAML any
			if err := yaml.Unmarshal(y.Bytes(), &fromYAML); err != nil {
				t.Fatalf("-o yaml of %s printed %q: %v", raw, y.String(), err)
			}
			// YAML's double quotes escape the C0 and C1 controls and DEL, not the bidi controls
			// and line separators, which YAML counts as printable.
			if strings.IndexFunc(y.String(), func(r rune) bool { return r != '\n' && (r < 0x20 || r >= 0x7f && r <= 0x9f) }) >= 0 {
				t.Fatalf("-o yaml of %s printed %q", raw, y.String())
			}
			if got, _ := json.Marshal(fromYAML); !bytes.Equal(got, want) {
				t.Fatalf("-o yaml changed the answer: %s, want %s\n%s", got, want, y.String())
			}
		}
		// An error's text, as a person reads it.
		var e bytes.Buffer
		report(&e, "table", &api.Error{Code: api.CodeNotFound, Message: text + "\xff", Details: map[string]any{"field": text}})
		report(&e, "table", errors.New(text))
		if !terminalSafe(e.String()) {
			t.Fatalf("an error printed %q", e.String())
		}
	})
}

// TestClean: the escapes a person reads.
func TestClean(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain name":           "plain name",
		"\x1b[31mred\x1b[0m":   `\x1b[31mred\x1b[0m`,
		"a\tb\nc\rd":           `a\tb\nc\rd`,
		"del\x7f":              `del\x7f`,
		"c1\u009b2J":           `c1\u009b2J`,
		"rtl\u202eabc":         `rtl\u202eabc`,
		"bad\xffbyte":          `bad\xffbyte`,
		"ünïcödé ✓ \U0001F600": "ünïcödé ✓ \U0001F600",
	} {
		if got := clean(in); got != want {
			t.Errorf("clean(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTables: what a table shows of an event, a reservation and the whole allocation of one.
func TestTables(t *testing.T) {
	t.Parallel()
	res := `{"id": "r1", "state": "active", "shape": {"gpus": 8, "model": "h100"}, "members": 1, "startsAt": "2030-01-02T15:04:05Z",
		"allocations": [{"nodeId": "n1", "node": "sim-00000", "gpus": [{"index": 0, "uuid": "GPU-aaa", "model": "H100"}, {"index": 1, "uuid": "GPU-bbb", "model": "H100"}], "cpuset": "0-7"}],
		"labels": {"team": "ml"}, "poolId": "p1", "tenantId": "root"}`
	cases := []struct {
		name, format, raw string
		want              []string
	}{
		{"events list", "table", `{"items": [{"id": 12, "type": "reservation.created", "subject": "r1", "tenantId": "root", "createdAt": "2030-01-02T15:04:05Z", "data": {"pool": "gpu"}}]}`,
			[]string{"ID  CREATED-AT            TYPE                 SUBJECT", "12  2030-01-02T15:04:05Z  reservation.created  r1"}},
		{"events list wide", "wide", `{"items": [{"id": 12, "type": "reservation.created", "subject": "r1", "tenantId": "root", "createdAt": "2030-01-02T15:04:05Z", "data": {"pool": "gpu"}}]}`,
			[]string{`{"pool":"gpu"}`}},
		{"reservations list", "table", `{"items": [` + res + `]}`,
			[]string{"SHAPE", "NODES", "8 × h100 GPU", "sim-00000"}},
		{"reservations get", "table", res,
			[]string{"allocations:", "GPU INDEX", "GPU UUID", "sim-00000", "GPU-aaa", "GPU-bbb", "labels.team", "shape.gpus"}},
		{"a big number stays exact", "table", `{"id": 9007199254740993}`, []string{"9007199254740993"}},
	}
	for _, c := range cases {
		var out bytes.Buffer
		if err := render(&out, c.format, json.RawMessage(c.raw)); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: no %q in\n%s", c.name, w, &out)
			}
		}
	}
}
