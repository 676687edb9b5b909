package api

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	yamlv2 "go.yaml.in/yaml/v2"
	"pgregory.net/rapid"
	"sigs.k8s.io/yaml"
)

// awkward are the runes text round trips have broken on: controls of both blocks, DEL, the
// non-characters, a BOM, line and paragraph separators, NEL, quotes, YAML's indicators, an
// astral rune and a combining mark.
var awkward = []rune{0, '\t', '\n', '\r', 0x1b, 0x7f, 0x80, 0x85, 0x9f, 0xa0, 0xad, 0x2028, 0x2029,
	0xfeff, 0xfdd0, 0xfdef, 0xfffd, 0xfffe, 0xffff, 0x1fffe, 0x10ffff, 0x1f600, 0x301, 0xe000,
	'"', '\'', '\\', ':', '#', '-', '?', '{', '[', '&', '*', '!', '|', '>', '%', '@', '`', ' ', 'a', 'z'}

func anyText() *rapid.Generator[string] {
	r := rapid.OneOf(rapid.SampledFrom(awkward), rapid.Rune(), rapid.RuneFrom(nil, unicode.Cc, unicode.Co, unicode.Zl, unicode.Zp))
	return rapid.Custom(func(t *rapid.T) string {
		return string(rapid.SliceOfN(r, 0, 12).Draw(t, "runes"))
	})
}

// TestAcceptedTextSurvivesEveryEncoding: text CheckString accepts is carried unchanged by every
// encoding an answer or an export uses (JSON, YAML through yaml.v2 and sigs.k8s.io/yaml), and
// text it refuses holds a rune that is no text (a control other than tab, line feed and carriage
// return, or a non-character).
func TestAcceptedTextSurvivesEveryEncoding(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := anyText().Draw(t, "s")
		err := CheckString("f", s)
		if err != nil {
			if !strings.ContainsFunc(s, func(r rune) bool { return !TextRune(r) }) {
				t.Fatalf("CheckString(%q) = %v, though every rune is text", s, err)
			}
			if e, ok := err.(*Error); !ok || e.Details["field"] != "f" {
				t.Fatalf("CheckString(%q) = %v, want an error naming the field", s, err)
			}
			return
		}
		in := map[string]string{"k": s}
		j, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var fromJSON map[string]string
		if err := json.Unmarshal(j, &fromJSON); err != nil || fromJSON["k"] != s {
			t.Fatalf("JSON changed %q to %q (%v)", s, fromJSON["k"], err)
		}
		y, err := yamlv2.Marshal(in)
		if err != nil {
			t.Fatalf("yaml.v2 cannot write %q: %v", s, err)
		}
		var fromYAML map[string]string
		if err := yamlv2.Unmarshal(y, &fromYAML); err != nil || fromYAML["k"] != s {
			t.Fatalf("yaml.v2 changed %q to %q (%v) by way of %q", s, fromYAML["k"], err, y)
		}
		var fromSigs map[string]string
		if err := yaml.Unmarshal(y, &fromSigs); err != nil || fromSigs["k"] != s {
			t.Fatalf("sigs.k8s.io/yaml changed %q to %q (%v) by way of %q", s, fromSigs["k"], err, y)
		}
	})
}

// TestCheckInputRefusesControlsEverywhere: a control character or a non-character is refused in
// any string of an input, nested or raw, naming its path.
func TestCheckInputRefusesControlsEverywhere(t *testing.T) {
	type inner struct {
		Labels map[string]string `json:"labels"`
	}
	type input struct {
		Name  string          `json:"name"`
		List  []string        `json:"list"`
		In    inner           `json:"in"`
		Args  json.RawMessage `json:"args"`
		Multi string          `json:"multi"`
	}
	ok := input{Name: "a", List: []string{"b"}, In: inner{Labels: map[string]string{"k": "v"}}, Args: json.RawMessage(`{"x":"y"}`),
		Multi: "line one\n\tline two\r\n"}
	if err := CheckInput(ok); err != nil {
		t.Fatalf("a clean input: %v", err)
	}
	for _, bad := range []string{"\x7f", "\x1b[31m", "\u0085", "\u009f", "\ufffe", "\uffff", "\U0001fffe", "\ufdd0", "\x0b"} {
		cases := map[string]input{
			"name":        {Name: "a" + bad},
			"list[0]":     {List: []string{bad}},
			"in.labels.k": {In: inner{Labels: map[string]string{"k": bad}}},
			"in.labels":   {In: inner{Labels: map[string]string{bad: "v"}}},
			"args.x":      {Args: json.RawMessage(`{"x":` + mustJSON(bad) + `}`)},
		}
		for field, in := range cases {
			err := CheckInput(in)
			if e, ok := err.(*Error); !ok || e.Code != CodeInvalidArgument || e.Details["field"] != field {
				t.Errorf("%q in %s: %v, want invalid_argument naming %s", bad, field, err, field)
			}
		}
	}
}

func mustJSON(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}
