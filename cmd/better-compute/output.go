package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// outputFormats are the values of -o.
var outputFormats = []string{"table", "json"}

// preferred are the columns shown first, when an item has them.
var preferred = []string{"id", "name", "state", "status", "health", "kind", "model", "mode", "index", "uuid", "poolId", "nodeId", "tenantId", "startsAt", "endsAt", "createdAt"}

// render writes an answer: as indented JSON, or as a table (a list, a page's items) or a
// key/value listing (one object).
func render(w io.Writer, format string, raw json.RawMessage) error {
	if format == "json" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			_, err = w.Write(raw)
			return err
		}
		buf.WriteByte('\n')
		_, err := buf.WriteTo(w)
		return err
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	switch x := v.(type) {
	case []any:
		table(tw, x)
	case map[string]any:
		if items, ok := x["items"].([]any); ok {
			table(tw, items)
			if next, _ := x["nextCursor"].(string); next != "" {
				fmt.Fprintf(tw, "\n(more: --cursor %s)\n", next)
			}
			return nil
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return rank(keys[i]) < rank(keys[j]) || rank(keys[i]) == rank(keys[j]) && keys[i] < keys[j]
		})
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%s\n", k, cell(x[k], 100))
		}
	default:
		fmt.Fprintln(tw, cell(v, 200))
	}
	return nil
}

func rank(k string) int {
	for i, p := range preferred {
		if p == k {
			return i
		}
	}
	return len(preferred)
}

func table(w io.Writer, items []any) {
	if len(items) == 0 {
		fmt.Fprintln(w, "(none)")
		return
	}
	first, ok := items[0].(map[string]any)
	if !ok {
		for _, it := range items {
			fmt.Fprintln(w, cell(it, 200))
		}
		return
	}
	var cols []string
	for _, p := range preferred {
		if v, ok := first[p]; ok && scalar(v) {
			cols = append(cols, p)
		}
	}
	if len(cols) < 3 {
		var rest []string
		for k, v := range first {
			if scalar(v) && rank(k) == len(preferred) {
				rest = append(rest, k)
			}
		}
		sort.Strings(rest)
		cols = append(cols, rest[:min(len(rest), 6-len(cols))]...)
	}
	if len(cols) > 7 {
		cols = cols[:7]
	}
	fmt.Fprintln(w, strings.ToUpper(strings.Join(cols, "\t")))
	for _, it := range items {
		m, _ := it.(map[string]any)
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = cell(m[c], 40)
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

func scalar(v any) bool {
	switch v.(type) {
	case string, float64, bool, nil:
		return true
	}
	return false
}

func cell(v any, max int) string {
	var s string
	switch x := v.(type) {
	case nil:
		s = ""
	case string:
		s = x
	case float64:
		s = fmt.Sprint(x)
	case bool:
		s = fmt.Sprint(x)
	default:
		b, _ := json.Marshal(x)
		s = string(b)
	}
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}
