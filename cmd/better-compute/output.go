package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// outputFormats are the values of -o: tables for people (wide: every column, nothing cut), JSON
// and YAML for scripts.
var outputFormats = []string{"table", "wide", "json", "yaml"}

// structured: whether a format is for scripts (the answer as it is, errors as envelopes).
func structured(format string) bool { return format == "json" || format == "yaml" }

// preferred are the columns shown first, when an item has them.
var preferred = []string{"id", "name", "type", "subject", "state", "status", "health", "kind", "model", "mode", "index", "uuid", "poolId", "nodeId", "tenantId", "startsAt", "endsAt", "createdAt"}

// render writes an answer: as JSON or YAML, or for people as a table (a list, a page's items)
// or a key/value listing (one object). Nothing a person reads passes a terminal control
// character through (clean).
func render(w io.Writer, format string, raw json.RawMessage) error {
	switch format {
	case "json":
		return writeJSON(w, raw)
	case "yaml":
		return writeYAML(w, raw)
	}
	v, err := decodeAnswer(raw)
	if err != nil {
		return err
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	switch x := v.(type) {
	case []any:
		table(tw, x, wide)
	case map[string]any:
		if items, ok := x["items"].([]any); ok {
			table(tw, items, wide)
			if next, _ := x["nextCursor"].(string); next != "" {
				fmt.Fprintf(tw, "\n(more: --cursor %s)\n", clean(next))
			}
			return nil
		}
		object(tw, x, "")
	default:
		fmt.Fprintln(tw, cell(v, 0))
	}
	return nil
}

// decodeAnswer decodes JSON keeping numbers exact (an event id or a byte count past 2^53).
func decodeAnswer(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// writeJSON writes raw indented, with DEL and the C1 controls escaped: JSON lets them stand raw
// in a string, and a terminal would act on them. Outside strings they cannot occur.
func writeJSON(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	return writeJSONLine(w, buf.Bytes())
}

// writeJSONLine writes JSON text and a newline, escaped as escapeJSON does.
func writeJSONLine(w io.Writer, b []byte) error {
	_, err := io.WriteString(w, escapeJSON(b)+"\n")
	return err
}

// escapeJSON writes as \u escapes what encoding/json leaves raw in a string and a terminal
// would act on (unsafeRune: DEL, the C1 controls, line separators, bidi controls) or YAML
// refuses to read raw (those, and U+FFFE and U+FFFF). Outside a string none of them can occur, so the text means the same.
func escapeJSON(b []byte) string {
	var out strings.Builder
	for _, r := range string(b) {
		if r >= 0x7f && unsafeRune(r) || r == '\ufffe' || r == '\uffff' {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.WriteRune(r)
		}
	}
	return out.String()
}

// writeYAML writes a JSON answer as YAML, in its order. JSON is YAML: the answer is parsed as a
// YAML node tree, then written in block style, which escapes what YAML cannot carry raw.
func writeYAML(w io.Writer, raw json.RawMessage) error {
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(escapeJSON(raw)), &n); err != nil {
		return fmt.Errorf("-o yaml: %w", err)
	}
	var block func(*yaml.Node)
	block = func(n *yaml.Node) {
		n.Style = 0
		if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.IndexFunc(n.Value, func(r rune) bool { return unsafeRune(r) || r == 0xfeff }) >= 0 {
			// Text with a tab, a newline or a control is written escaped in double quotes: a
			// literal block carries them raw (and yaml.v3 writes one it cannot read back, when a
			// line begins with a tab).
			n.Style = yaml.DoubleQuotedStyle
		}
		for _, c := range n.Content {
			block(c)
		}
	}
	block(&n)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return fmt.Errorf("-o yaml: %w", err)
	}
	return enc.Close()
}

// writeValue writes a value of the CLI's own (not an answer's raw JSON) in a structured format.
func writeValue(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if format == "yaml" {
		return writeYAML(w, b)
	}
	return writeJSON(w, b)
}

// writeStream writes one of a stream's values (an event of events watch, a run's change): with
// -o json a JSON object a line, with -o yaml a YAML document each.
func writeStream(w io.Writer, format string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if format == "yaml" {
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
		return writeYAML(w, b)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return err
	}
	return writeJSONLine(w, compact.Bytes())
}

func rank(k string) int {
	if i := slices.Index(preferred, k); i >= 0 {
		return i
	}
	return len(preferred)
}

func byRank(keys []string) {
	sort.SliceStable(keys, func(i, j int) bool {
		return rank(keys[i]) < rank(keys[j]) || rank(keys[i]) == rank(keys[j]) && keys[i] < keys[j]
	})
}

// A column of a table: its header and how a row's item shows in it.
type column struct {
	header string
	value  func(m map[string]any) string
}

// view is how the items of one kind show as a table, instead of the columns picked by name:
// an item is of the kind when it has every key of match.
type view struct {
	match []string
	cols  []column
	wide  []column // more columns with -o wide
}

func field(k string) column {
	return column{header(k), func(m map[string]any) string { return cell(m[k], 40) }}
}

// header is a field's column header: a key may be a tenant's (a label's), so it is cleaned too.
func header(k string) string { return clean(strings.ToUpper(kebab(k))) }

var views = []view{
	{ // events: what happened, to what
		match: []string{"type", "subject", "createdAt", "data"},
		cols:  []column{field("id"), field("createdAt"), field("type"), field("subject")},
		wide:  []column{{"DATA", func(m map[string]any) string { return cell(m["data"], 0) }}},
	},
	{ // reservations: the shape and the nodes that hold it
		match: []string{"shape", "allocations", "state"},
		cols: []column{field("id"), field("state"), {"SHAPE", func(m map[string]any) string { return shapeOf(m) }},
			{"NODES", func(m map[string]any) string { return nodesOf(m) }}, field("startsAt"), field("endsAt")},
		wide: []column{field("poolId"), field("tenantId"), field("endReason"), field("createdBy")},
	},
}

// shapeOf is a reservation's shape in words: 8 × h100 GPUs, 1 × 3g.40gb, 16 vCPUs, 64 GiB.
func shapeOf(m map[string]any) string {
	s, _ := m["shape"].(map[string]any)
	num := func(k string) string {
		if n, ok := s[k].(json.Number); ok && n.String() != "0" {
			return n.String()
		}
		return ""
	}
	model, _ := s["model"].(string)
	var parts []string
	gpu := "GPU"
	if model != "" {
		gpu = model + " GPU"
	}
	switch mig, _ := s["migProfile"].(string); {
	case num("gpus") != "":
		parts = append(parts, num("gpus")+" × "+gpu)
	case mig != "":
		parts = append(parts, "1 × "+mig)
	case s["timeSlice"] == true:
		parts = append(parts, "1 × "+gpu+" share")
	}
	if s["nvlink"] == true {
		parts = append(parts, "NVLink")
	}
	if n := num("vcpus"); n != "" {
		parts = append(parts, n+" vCPUs")
	}
	if n := num("memoryGiB"); n != "" {
		parts = append(parts, n+" GiB")
	}
	if n, ok := m["members"].(json.Number); ok && n.String() != "1" && n.String() != "0" {
		parts = append(parts, "× "+n.String()+" members")
	}
	return clean(strings.Join(parts, ", "))
}

// nodesOf names the nodes a reservation's allocations hold.
func nodesOf(m map[string]any) string {
	as, _ := m["allocations"].([]any)
	var names []string
	for _, a := range as {
		a, _ := a.(map[string]any)
		name, _ := a["node"].(string)
		if name == "" {
			name, _ = a["nodeId"].(string)
		}
		if name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return cell(strings.Join(names, ","), 60)
}

func table(w io.Writer, items []any, wide bool) {
	if len(items) == 0 {
		fmt.Fprintln(w, "(none)")
		return
	}
	first, ok := items[0].(map[string]any)
	if !ok {
		for _, it := range items {
			fmt.Fprintln(w, cell(it, 0))
		}
		return
	}
	cols := columnsFor(first, wide)
	headers := make([]string, len(cols))
	for i, c := range cols {
		headers[i] = c.header
	}
	fmt.Fprintln(w, strings.Join(headers, "\t"))
	for _, it := range items {
		m, _ := it.(map[string]any)
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = c.value(m)
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

// columnsFor picks a table's columns from its first item: its kind's view, or the preferred
// scalar fields (with -o wide, every field, none cut short).
func columnsFor(first map[string]any, wide bool) []column {
	for _, v := range views {
		if hasAll(first, v.match) {
			if wide {
				return append(slices.Clone(v.cols), v.wide...)
			}
			return v.cols
		}
	}
	keys := make([]string, 0, len(first))
	for k := range first {
		keys = append(keys, k)
	}
	byRank(keys)
	var cols []column
	for _, k := range keys {
		switch {
		case wide:
			cols = append(cols, column{header(k), func(m map[string]any) string { return cell(m[k], 0) }})
		case scalar(first[k]) && (rank(k) < len(preferred) || len(cols) < 6):
			cols = append(cols, field(k))
		}
	}
	if !wide && len(cols) > 7 {
		cols = cols[:7]
	}
	return cols
}

func hasAll(m map[string]any, keys []string) bool {
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// object lists one object's fields, a line each, nothing cut short: a nested object's fields
// under its name (allocations.node), a list of objects as a table of its own (a reservation's
// allocations, a row per GPU).
func object(w io.Writer, m map[string]any, prefix string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	byRank(keys)
	var lists []string
	for _, k := range keys {
		switch x := m[k].(type) {
		case map[string]any:
			if len(x) == 0 {
				fmt.Fprintf(w, "%s%s\t\n", prefix, clean(k))
			}
			object(w, x, prefix+clean(k)+".")
		case []any:
			if len(x) > 0 && !scalar(x[0]) {
				lists = append(lists, k)
				continue
			}
			fmt.Fprintf(w, "%s%s\t%s\n", prefix, clean(k), cell(x, 0))
		default:
			fmt.Fprintf(w, "%s%s\t%s\n", prefix, clean(k), cell(x, 0))
		}
	}
	for _, k := range lists {
		fmt.Fprintf(w, "\n%s%s:\n", prefix, clean(k))
		subTable(w, m[k].([]any))
	}
}

// subTable is a list of objects within an object, every field shown: a field that is itself a
// list of objects (an allocation's gpus) makes a row of each of its items, under the outer
// item's fields (NODE, GPU INDEX, GPU UUID).
func subTable(w io.Writer, items []any) {
	var outer, inner []string
	var nested string
	for _, it := range items {
		m, _ := it.(map[string]any)
		for k, v := range m {
			if xs, ok := v.([]any); ok && len(xs) > 0 && !scalar(xs[0]) {
				if nested == "" {
					nested = k
				}
				if k == nested {
					for _, x := range xs {
						xm, _ := x.(map[string]any)
						for ik := range xm {
							if !slices.Contains(inner, ik) {
								inner = append(inner, ik)
							}
						}
					}
					continue
				}
			}
			if !slices.Contains(outer, k) {
				outer = append(outer, k)
			}
		}
	}
	byRank(outer)
	byRank(inner)
	var headers []string
	for _, k := range outer {
		headers = append(headers, header(k))
	}
	label := header(strings.TrimSuffix(nested, "s"))
	for _, k := range inner {
		headers = append(headers, label+" "+header(k))
	}
	fmt.Fprintln(w, "  "+strings.Join(headers, "\t"))
	for _, it := range items {
		m, _ := it.(map[string]any)
		var row []string
		for _, k := range outer {
			row = append(row, cell(m[k], 0))
		}
		xs, _ := m[nested].([]any)
		if len(xs) == 0 {
			fmt.Fprintln(w, "  "+strings.Join(row, "\t"))
			continue
		}
		for _, x := range xs {
			xm, _ := x.(map[string]any)
			r := slices.Clone(row)
			for _, k := range inner {
				r = append(r, cell(xm[k], 0))
			}
			fmt.Fprintln(w, "  "+strings.Join(r, "\t"))
		}
	}
}

func scalar(v any) bool {
	switch v.(type) {
	case string, json.Number, float64, bool, nil:
		return true
	}
	return false
}

// cell is a value as a table shows it: text as it is, anything else as compact JSON, with
// control characters escaped, cut to max runes (0: never cut).
func cell(v any, max int) string {
	var s string
	switch x := v.(type) {
	case nil:
		s = ""
	case string:
		s = x
	case json.Number:
		s = x.String()
	case float64, bool:
		s = fmt.Sprint(x)
	case []any:
		if len(x) > 0 && scalar(x[0]) {
			parts := make([]string, len(x))
			for i, e := range x {
				parts[i] = cell(e, 0)
			}
			s = strings.Join(parts, ",")
			break
		}
		b, _ := json.Marshal(x)
		s = string(b)
	default:
		b, _ := json.Marshal(x)
		s = string(b)
	}
	s = clean(s)
	if max > 0 && utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max-1]) + "…"
	}
	return s
}

// clean makes text safe to print on a terminal: the C0 controls (tab and newline included: they
// would break a table's rows), DEL, the C1 controls and the Unicode line separators and bidi
// controls are written as escapes (\x1b, \u0085), so a name holding ESC sequences cannot reach
// an operator's terminal as one.
func clean(s string) string {
	if strings.IndexFunc(s, unsafeRune) < 0 && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[i]) // not UTF-8: the byte
			i++
			continue
		}
		i += size
		switch {
		case !unsafeRune(r):
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// unsafeRune: a rune a terminal acts on rather than shows.
func unsafeRune(r rune) bool {
	return r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f || r == '\u2028' || r == '\u2029' ||
		unicode.Is(unicode.Bidi_Control, r)
}
