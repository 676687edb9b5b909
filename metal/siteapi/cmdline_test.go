package siteapi

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// linuxArg is an argument as the kernel hands it on: param, and val (nil: no "=").
type linuxArg struct {
	Param string
	Val   *string
}

// linuxParse is Linux's parse_args and next_arg (kernel/params.c, lib/cmdline.c, v6.1)
// transliterated from C, the NULs it writes into the line and all: the kernel's arguments up
// to a lone "--", and init's after it (parse_args again, up to the next "--"). It is the
// oracle SplitCmdline and SetCmdline are checked against, kept as close to the C as Go
// allows rather than shared with them.
func linuxParse(cmdline string) (kernel, init []linuxArg) {
	buf := append([]byte(cmdline), 0)
	isspace := func(c byte) bool { return c == ' ' || c >= 9 && c <= 13 || c == 160 }
	skipSpaces := func(p int) int {
		for isspace(buf[p]) {
			p++
		}
		return p
	}
	cstr := func(p int) string {
		e := p
		for buf[e] != 0 {
			e++
		}
		return string(buf[p:e])
	}
	nextArg := func(args int) (param, val, next int) {
		i, equals := 0, 0
		inQuote, quoted := false, false
		if buf[args] == '"' {
			args++
			inQuote, quoted = true, true
		}
		for i = 0; buf[args+i] != 0; i++ {
			if isspace(buf[args+i]) && !inQuote {
				break
			}
			if equals == 0 {
				if buf[args+i] == '=' {
					equals = i
				}
			}
			if buf[args+i] == '"' {
				inQuote = !inQuote
			}
		}
		param, val = args, -1
		if equals != 0 {
			buf[args+equals] = 0
			val = args + equals + 1
			// Don't include quotes in value.
			if buf[val] == '"' {
				val++
				if buf[args+i-1] == '"' {
					buf[args+i-1] = 0
				}
			}
		}
		if quoted && i > 0 && buf[args+i-1] == '"' {
			buf[args+i-1] = 0
		}
		if buf[args+i] != 0 {
			buf[args+i] = 0
			args += i + 1
		} else {
			args += i
		}
		return param, val, skipSpaces(args)
	}
	parseArgs := func(args int) (out []linuxArg, afterDashes int) {
		args = skipSpaces(args)
		for buf[args] != 0 {
			param, val, next := nextArg(args)
			args = next
			a := linuxArg{Param: cstr(param)}
			if val >= 0 {
				v := cstr(val)
				a.Val = &v
			}
			// Stop at --
			if a.Val == nil && a.Param == "--" {
				return out, args
			}
			out = append(out, a)
		}
		return out, -1
	}
	kernel, after := parseArgs(0)
	if after >= 0 {
		init, _ = parseArgs(after)
	}
	return kernel, init
}

func str(s string) *string { return &s }

// TestSplitCmdlineAsLinux: command lines whose splitting by the kernel was worked out by hand
// from its C, each split the same by the oracle and by SplitCmdline.
func TestSplitCmdlineAsLinux(t *testing.T) {
	cases := []struct {
		cmdline string
		kernel  []linuxArg
		init    []linuxArg
	}{
		{"root=/dev/vda console=ttyS0", []linuxArg{{"root", str("/dev/vda")}, {"console", str("ttyS0")}}, nil},
		{`  a="b c"  d `, []linuxArg{{"a", str("b c")}, {"d", nil}}, nil},
		// An unbalanced quote takes the rest of the line, "--" and all.
		{`console="ttyS0 bcd.join=x -- init`, []linuxArg{{"console", str("ttyS0 bcd.join=x -- init")}}, nil},
		{`quiet -- single bcd.join=x`, []linuxArg{{"quiet", nil}}, []linuxArg{{"single", nil}, {"bcd.join", str("x")}}},
		{`quiet "--" single`, []linuxArg{{"quiet", nil}}, []linuxArg{{"single", nil}}},
		// Only an opening quote (of the word or of its value) and the closing one are dropped.
		{`a=b"c d" "e=f g"h`, []linuxArg{{"a", str(`b"c d"`)}, {"e", str(`f g"h`)}}, nil},
		{`"a=b" x="y" z="" w="`, []linuxArg{{"a", str("b")}, {"x", str("y")}, {"z", str("")}, {"w", str("")}}, nil},
		// An "=" opening a word is not the name's end; the next one is.
		{`=a=b =c`, []linuxArg{{"=a", str("b")}, {"=c", nil}}, nil},
		// 0xa0 and \v are spaces to the kernel; a NUL ends the line.
		{"a=1\xa0b=2\vc=3\x00d=4", []linuxArg{{"a", str("1")}, {"b", str("2")}, {"c", str("3")}}, nil},
		{`"`, []linuxArg{{"", nil}}, nil},
		{"", nil, nil},
	}
	for _, c := range cases {
		k, i := linuxParse(c.cmdline)
		if d := cmp.Diff(c.kernel, k); d != "" {
			t.Errorf("%q: the oracle's kernel arguments (-worked out +oracle):\n%s", c.cmdline, d)
		}
		if d := cmp.Diff(c.init, i); d != "" {
			t.Errorf("%q: the oracle's init arguments (-worked out +oracle):\n%s", c.cmdline, d)
		}
		checkSplit(t, c.cmdline)
	}
}

// checkSplit checks SplitCmdline against the oracle on one command line.
func checkSplit(t *testing.T, cmdline string) {
	t.Helper()
	args, init, dashdash := SplitCmdline(cmdline)
	var got []linuxArg
	for _, a := range args {
		la := linuxArg{Param: a.Name}
		if a.HasValue {
			la.Val = str(a.Value)
		}
		got = append(got, la)
	}
	k, i := linuxParse(cmdline)
	if d := cmp.Diff(k, got); d != "" {
		t.Fatalf("SplitCmdline(%q) differs from Linux (-linux +SplitCmdline):\n%s", cmdline, d)
	}
	if _, ii := linuxParse("x -- " + init); dashdash && !cmp.Equal(i, ii) {
		t.Fatalf("SplitCmdline(%q)'s init %q is not the init Linux has, %v", cmdline, init, i)
	}
	if !dashdash && init != "" {
		t.Fatalf("SplitCmdline(%q): init %q without --", cmdline, init)
	}
	// The Raw of the arguments, joined, split the same way again.
	var raws []string
	for _, a := range args {
		raws = append(raws, a.Raw)
	}
	if again, _ := linuxParse(strings.Join(raws, " ")); !cmp.Equal(again, k) {
		t.Fatalf("SplitCmdline(%q): its arguments' Raw, joined, are %v to Linux, not %v", cmdline, again, k)
	}
}

// FuzzSetCmdline: whatever an image's command line holds, the kernel given SetCmdline's line
// sees each of bcd's parameters once, with its value, among its own arguments (not init's),
// and everything else of the image's line as the image's line had it. Values SetCmdline
// refuses are ones the kernel could not carry intact. The seeds (testdata/fuzz) run with go test.
func FuzzSetCmdline(f *testing.F) {
	f.Add("root=/dev/vda console=ttyS0", "http://compute.test", "bcdeploy_abc", "rack1-u01")
	f.Fuzz(func(t *testing.T, image, url, join, hostname string) {
		params := []CmdlineParam{{CmdlineJoinURL, url}, {CmdlineJoin, join}, {CmdlineHostname, hostname}}
		out, err := SetCmdline(image, params...)
		bad := false
		for _, p := range params {
			bad = bad || strings.ContainsFunc(p.Value, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' })
		}
		if bad != (err != nil) {
			t.Fatalf("SetCmdline(%q, %q) = %q, %v; a value with spaces, quotes or other than printable ASCII is the only refusal", image, params, out, err)
		}
		if err != nil {
			return
		}
		checkSplit(t, image)
		checkSplit(t, out)
		kernel, init := linuxParse(out)
		ours := map[string]bool{}
		for _, p := range params {
			ours[normalName(p.Name)] = true
			var seen []linuxArg
			for _, a := range kernel {
				if normalName(a.Param) == normalName(p.Name) {
					seen = append(seen, a)
				}
			}
			if len(seen) != 1 || seen[0].Val == nil || *seen[0].Val != p.Value {
				t.Fatalf("SetCmdline(%q) = %q: the kernel sees %s as %v, want once, %q", image, out, p.Name, seen, p.Value)
			}
			if got := ParseCmdline(out)[p.Name]; got != p.Value {
				t.Fatalf("SetCmdline(%q) = %q: ParseCmdline reads %s as %q, want %q", image, out, p.Name, got, p.Value)
			}
		}
		imgKernel, imgInit := linuxParse(image)
		others := func(args []linuxArg) []linuxArg {
			var o []linuxArg
			for _, a := range args {
				if !ours[normalName(a.Param)] {
					o = append(o, a)
				}
			}
			return o
		}
		if d := cmp.Diff(others(imgKernel), others(kernel)); d != "" {
			t.Fatalf("SetCmdline(%q) = %q: the image's own kernel arguments changed (-image +built):\n%s", image, out, d)
		}
		if d := cmp.Diff(imgInit, init); d != "" {
			t.Fatalf("SetCmdline(%q) = %q: init's arguments changed (-image +built):\n%s", image, out, d)
		}
	})
}

func TestSetCmdlineRefuses(t *testing.T) {
	for _, c := range []struct {
		params []CmdlineParam
		says   string
	}{
		{[]CmdlineParam{{"bcd.join", "a b"}}, "without spaces or quotes"},
		{[]CmdlineParam{{"bcd.join", `a"b`}}, "without spaces or quotes"},
		{[]CmdlineParam{{"bcd join", "x"}}, "a name is"},
		{[]CmdlineParam{{"a=b", "x"}}, "a name is"},
		{[]CmdlineParam{{"", "x"}}, "a name is"},
		{[]CmdlineParam{{"bcd.ssh_keys", "x"}, {"bcd.ssh-keys", "y"}}, "given twice"},
	} {
		if out, err := SetCmdline("quiet", c.params...); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("SetCmdline(%v) = %q, %v; want an error saying %q", c.params, out, err, c.says)
		}
	}
	if out, err := SetCmdline(`a -- b`, CmdlineParam{"bcd.join", "j"}); err != nil || out != "bcd.join=j a -- b" {
		t.Errorf("SetCmdline = %q, %v", out, err)
	}
}
