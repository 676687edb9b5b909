package siteapi

import (
	"fmt"
	"strings"
)

// CmdlineArg is one argument of a kernel command line, as Linux splits it.
type CmdlineArg struct {
	// Raw is the argument's text on the command line, quotes and all: joined by spaces, the Raw
	// of a command line's arguments split the same way again.
	Raw string
	// Name and Value are what Linux reads (the quotes it drops dropped); HasValue is false for
	// a word without "=", which Linux passes to init.
	Name, Value string
	HasValue    bool
}

// SplitCmdline splits a kernel command line the way Linux does (parse_args and next_arg, in
// kernel/params.c and lib/cmdline.c): arguments are separated by unquoted spaces (the kernel's
// isspace: space, \t to \r, and 0xa0); a double quote starts or ends a quoted part anywhere in
// a word, so an unbalanced one takes the rest of the line into its argument; a quote opening a
// word or its value is dropped, and so is the quote ending that word or value, no other; the
// arguments end at a lone "--" (or `"--"`), after which the text (init) is init's. Linux stops
// at a NUL byte, and so does SplitCmdline. dashdash says whether there was a "--".
func SplitCmdline(cmdline string) (args []CmdlineArg, init string, dashdash bool) {
	if i := strings.IndexByte(cmdline, 0); i >= 0 {
		cmdline = cmdline[:i]
	}
	s := skipKernelSpaces(cmdline)
	for s != "" {
		a, rest := nextArg(s)
		if !a.HasValue && a.Name == "--" {
			return args, rest, true
		}
		args = append(args, a)
		s = rest
	}
	return args, "", false
}

// kernelSpace is Linux's isspace (lib/ctype.c, Latin-1): 0xa0 is a space to the kernel.
func kernelSpace(c byte) bool { return c == ' ' || '\t' <= c && c <= '\r' || c == 0xa0 }

func skipKernelSpaces(s string) string {
	for s != "" && kernelSpace(s[0]) {
		s = s[1:]
	}
	return s
}

// nextArg is lib/cmdline.c's next_arg on a non-empty s without leading spaces: the argument s
// starts with, and the text after it.
func nextArg(s string) (CmdlineArg, string) {
	word := s
	quoted := s[0] == '"'
	inQuote := quoted
	if quoted {
		s = s[1:]
	}
	i, equals := 0, 0
	for ; i < len(s); i++ {
		c := s[i]
		if kernelSpace(c) && !inQuote {
			break
		}
		if equals == 0 && c == '=' { // an "=" at 0 is not one, as in the kernel
			equals = i
		}
		if c == '"' {
			inQuote = !inQuote
		}
	}
	a := CmdlineArg{Raw: word[:len(word)-len(s)+i]}
	// The kernel cuts the word in place with NULs; end is where the cut text ends.
	text, end := s[:i], i
	if i > 0 && text[i-1] == '"' && (quoted || equals != 0 && equals+1 < i && text[equals+1] == '"') {
		end = i - 1 // the quote that closes a quoted word, or a quoted value
	}
	if equals != 0 {
		a.HasValue = true
		a.Name = text[:equals]
		v := equals + 1
		if v < i && text[v] == '"' {
			v++
		}
		a.Value = text[min(v, end):end]
	} else {
		a.Name = text[:end]
	}
	rest := ""
	if i < len(s) {
		rest = skipKernelSpaces(s[i+1:])
	}
	return a, rest
}

// ParseCmdline reads a kernel command line (the text of /proc/cmdline) as SplitCmdline does:
// name=value for each argument with a value, the last of a name counting, nothing after a lone
// "--" (init's). Words without "=" are skipped.
func ParseCmdline(cmdline string) map[string]string {
	args, _, _ := SplitCmdline(cmdline)
	params := map[string]string{}
	for _, a := range args {
		if a.HasValue {
			params[a.Name] = a.Value
		}
	}
	return params
}

// CmdlineParam is a name=value that SetCmdline puts on a command line.
type CmdlineParam struct{ Name, Value string }

// SetCmdline rebuilds a kernel command line with each of params as name=value exactly once,
// before any other argument: every argument of cmdline that Linux would read with one of those
// names (hyphens and underscores alike, with or without a value) is left out, and the rest
// follows in its order, as it was written, then "--" and init's arguments if cmdline had them.
// Whatever cmdline holds (an unbalanced quote, a lone "--", a NUL), the kernel reads params as
// given: they come first, where nothing of cmdline can reach them. A name is letters, digits,
// ".", "_" and "-"; a value is printable ASCII without spaces or quotes.
func SetCmdline(cmdline string, params ...CmdlineParam) (string, error) {
	ours := make([]string, 0, len(params))
	drop := map[string]bool{}
	for _, p := range params {
		if !cmdlineName(p.Name) {
			return "", fmt.Errorf("kernel parameter %q: a name is letters, digits, '.', '_' and '-'", p.Name)
		}
		if strings.ContainsFunc(p.Value, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' }) {
			return "", fmt.Errorf("kernel parameter %s: its value must be printable ASCII without spaces or quotes", p.Name)
		}
		if drop[normalName(p.Name)] {
			return "", fmt.Errorf("kernel parameter %s is given twice", p.Name)
		}
		drop[normalName(p.Name)] = true
		ours = append(ours, p.Name+"="+p.Value)
	}
	args, init, dashdash := SplitCmdline(cmdline)
	for _, a := range args {
		if !drop[normalName(a.Name)] {
			ours = append(ours, a.Raw)
		}
	}
	if dashdash {
		ours = append(ours, "--")
		if init != "" {
			ours = append(ours, init)
		}
	}
	return strings.Join(ours, " "), nil
}

func cmdlineName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-')
	})
}

// normalName is a parameter's name as the kernel compares them: "-" and "_" alike.
func normalName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// MaxCmdline is the longest kernel command line x86 Linux reads (COMMAND_LINE_SIZE, 2048,
// with its NUL); it cuts a longer one.
const MaxCmdline = 2047
