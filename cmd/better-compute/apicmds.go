package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/modules"
)

// apiCommands makes a command per group and method of the method table, the core's and the
// modules' that dev and serve run (cliModules), with flags from the method's input type.
func apiCommands(p *profile) []*cobra.Command {
	mods, err := moduleTable()
	if err != nil {
		panic(fmt.Sprintf("better-compute: the modules' methods: %v", err)) // fixed at build time; a test builds them
	}
	groups := map[string]*cobra.Command{}
	var order []*cobra.Command
	add := func(ds []api.Describer, of string) {
		for _, d := range ds {
			info := d.Info()
			g, ok := groups[info.Group]
			if !ok {
				g = &cobra.Command{Use: kebab(info.Group), Short: "The " + info.Group + " group of the API" + of}
				groups[info.Group] = g
				order = append(order, g)
			}
			g.AddCommand(methodCmd(p, d))
		}
	}
	add(api.Table(), "")
	add(mods, " (a module's: served where it runs, as by dev and serve)")
	return order
}

// binding sets one field of an input from a flag.
type binding struct {
	flag  string
	index []int
	set   func(v reflect.Value, fs *pflag.FlagSet) error
}

// reservedFlags are the CLI's own flags on a method's command: the root's (--server, --api-key,
// --config, --output) and the method command's (--json, --idempotency-key, --help). An input
// field of one of these names gets the flag --input-NAME, so that it neither shadows the CLI's
// flag (a method's --server can never send the call elsewhere) nor is silently dropped. The
// root's hidden --url is not here: a method's --url is its input's (webhooks create --url).
var reservedFlags = []string{serverFlag, "api-key", "config", "output", "json", "idempotency-key", "help"}

// methodCommand is a method's command: its input from --json, then the flags, then the argument.
type methodCommand struct {
	info       api.MethodInfo
	in         reflect.Type
	raw, key   string
	bindings   []binding
	positional string // the input field a lone argument fills, or ""
}

func methodCmd(p *profile, d api.Describer) *cobra.Command {
	c, _ := newMethodCommand(p, d)
	return c
}

func newMethodCommand(p *profile, d api.Describer) (*cobra.Command, *methodCommand) {
	info := d.Info()
	in, _ := d.Types()
	m := &methodCommand{info: info, in: in, positional: positionalField(info, in)}
	use := kebab(info.Name)
	if m.positional != "" {
		use += " [" + kebab(m.positional) + "]"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: info.Summary,
		Long:  fmt.Sprintf("%s\n\nPOST %s, IAM action %s on %s.", info.Summary, info.Path(), info.Action, info.Resource),
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := m.input(cmd, args)
			if err != nil {
				return err
			}
			if p.URL == "" {
				return usageError{Err: errors.New("no control plane: pass --server or set BETTER_COMPUTE_URL")}
			}
			cl, err := client.New(p.URL, client.WithAPIKey(p.APIKey), client.WithUserAgent("better-compute/"+version))
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if m.key != "" {
				ctx = api.WithIdempotencyKey(ctx, m.key)
			}
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			out, err := cl.Do(ctx, info, v.Interface())
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), p.Output, out)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&m.raw, "json", "", "the whole input as a JSON object (flags then override its fields)")
	if info.Mutating {
		fs.StringVar(&m.key, "idempotency-key", "", "repeat the call safely: the same key and input return the first answer")
	}
	m.bindings = bindFields(fs, in, nil)
	return cmd, m
}

// input is the method's input from a parsed command line: --json, then the flags over it, then
// the argument.
func (m *methodCommand) input(cmd *cobra.Command, args []string) (reflect.Value, error) {
	v, err := decodeInput(m.in, m.raw)
	if err != nil {
		return v, err
	}
	for _, b := range m.bindings {
		if cmd.Flags().Changed(b.flag) {
			if err := b.set(v.Elem().FieldByIndex(b.index), cmd.Flags()); err != nil {
				return v, usageError{Err: fmt.Errorf("--%s: %w", b.flag, err)}
			}
		}
	}
	group, name := kebab(m.info.Group), kebab(m.info.Name)
	if len(args) == 1 {
		if m.positional == "" {
			return v, usageError{Err: fmt.Errorf("%s %s takes no argument", group, name)}
		}
		f := v.Elem().FieldByName(m.positional)
		if f.Kind() == reflect.Int64 {
			n, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return v, usageError{Err: fmt.Errorf("%s %s: %q is not a %s (a number)", group, name, args[0], kebab(m.positional))}
			}
			f.SetInt(n)
		} else {
			f.SetString(args[0])
		}
	}
	if m.positional != "" && v.Elem().FieldByName(m.positional).IsZero() {
		// Every method that takes its resource as the argument requires it (a test checks).
		arg := kebab(m.positional)
		return v, usageError{Err: fmt.Errorf("%s %s needs a %s: %s %s (or --%s)", group, name, arg, cmd.CommandPath(), strings.ToUpper(arg), arg)}
	}
	return v.Elem(), nil
}

// decodeInput makes a method's input from --json, decoded as strictly as the API decodes a body:
// an unknown field, a wrong type or trailing data is a usage error naming what was wrong, never
// silently dropped.
func decodeInput(in reflect.Type, raw string) (reflect.Value, error) {
	v := reflect.New(in)
	if raw == "" {
		return v, nil
	}
	if err := modules.DecodeJSON([]byte(raw), v.Interface()); err != nil {
		var ae *api.Error
		if errors.As(err, &ae) {
			return v, usageError{Err: &api.Error{Code: ae.Code, Message: "--json: " + ae.Message, Details: ae.Details}}
		}
		return v, usageError{Err: fmt.Errorf("--json: %w", err)}
	}
	return v, nil
}

// positionalField is the input field a lone argument fills: the resource the method acts on,
// named as its group in the singular (pools get h100 fills Pool, webhooks test W fills Webhook,
// sandbox-snapshots restore S fills Snapshot), for every method of every group alike but create
// and list, which act on none yet.
func positionalField(info api.MethodInfo, in reflect.Type) string {
	if f, ok := positionalByMethod[info.FullName()]; ok {
		return f
	}
	if info.Name == "create" || info.Name == "list" || info.Name == "register" {
		return ""
	}
	name, ok := positionalByGroup[info.Group]
	if !ok {
		name = singular(info.Group)
	}
	if f, ok := in.FieldByName(name); ok && (f.Type.Kind() == reflect.String || f.Type == int64Type) {
		return name
	}
	return ""
}

// The resources named otherwise than as their group in the singular.
var (
	positionalByGroup  = map[string]string{"capacity": "Pool", "workflows": "Run", "releases": "Version"}
	positionalByMethod = map[string]string{"webhooks.redeliver": "Delivery", "access.revoke": "Serial"}
)

// singular is the last word of a group's name in the singular, as its input field is named:
// joinTokens → Token, sandboxes → Sandbox, vmImages → Image.
func singular(group string) string {
	i := strings.LastIndexFunc(group, unicode.IsUpper)
	word := group[max(i, 0):]
	switch {
	case strings.HasSuffix(word, "xes"):
		word = strings.TrimSuffix(word, "es")
	case strings.HasSuffix(word, "ies"):
		word = strings.TrimSuffix(word, "ies") + "y"
	default:
		word = strings.TrimSuffix(word, "s")
	}
	return strings.ToUpper(word[:1]) + word[1:]
}

// bindFields makes a flag for every field a flag can carry, into embedded structs too.
func bindFields(fs *pflag.FlagSet, t reflect.Type, prefix []int) []binding {
	var out []binding
	for i := range t.NumField() {
		f := t.Field(i)
		idx := append(append([]int(nil), prefix...), i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, bindFields(fs, f.Type, idx)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		flag := kebab(name)
		usage := "the input's " + name
		if slices.Contains(reservedFlags, flag) {
			usage += " (--" + flag + " is the CLI's own)"
			flag = "input-" + flag
		}
		if b, ok := flagFor(fs, flag, f.Type, usage); ok {
			b.index = idx
			out = append(out, b)
		}
	}
	return out
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	rawType   = reflect.TypeFor[json.RawMessage]()
	int64Type = reflect.TypeFor[int64]()
)

func flagFor(fs *pflag.FlagSet, flag string, t reflect.Type, usage string) (binding, bool) {
	b := binding{flag: flag}
	ptr := t.Kind() == reflect.Pointer
	base := t
	if ptr {
		base = t.Elem()
	}
	set := func(v reflect.Value, x reflect.Value) {
		if ptr {
			p := reflect.New(base)
			p.Elem().Set(x)
			v.Set(p)
		} else {
			v.Set(x)
		}
	}
	switch {
	case base == timeType:
		fs.String(flag, "", usage+" (RFC 3339, e.g. 2030-01-02T15:04:05Z)")
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			s, _ := fs.GetString(flag)
			tm, err := time.Parse(time.RFC3339, s)
			if err != nil {
				return fmt.Errorf("%q is not an RFC 3339 time", s)
			}
			set(v, reflect.ValueOf(tm))
			return nil
		}
	case base == rawType:
		fs.String(flag, "", usage+" (a JSON object)")
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			s, _ := fs.GetString(flag)
			if !json.Valid([]byte(s)) {
				return fmt.Errorf("%q is not JSON", s)
			}
			v.Set(reflect.ValueOf(json.RawMessage(s)))
			return nil
		}
	case base.Kind() == reflect.String:
		fs.String(flag, "", usage)
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			s, _ := fs.GetString(flag)
			set(v, reflect.ValueOf(s).Convert(base))
			return nil
		}
	case base.Kind() == reflect.Int:
		fs.Int(flag, 0, usage)
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			n, _ := fs.GetInt(flag)
			set(v, reflect.ValueOf(n))
			return nil
		}
	case base == int64Type: // ids and sizes of the event log (bigint)
		fs.Int64(flag, 0, usage)
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			n, _ := fs.GetInt64(flag)
			set(v, reflect.ValueOf(n))
			return nil
		}
	case base.Kind() == reflect.Bool:
		fs.Bool(flag, false, usage)
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			x, _ := fs.GetBool(flag)
			set(v, reflect.ValueOf(x))
			return nil
		}
	case base.Kind() == reflect.Slice && base.Elem().Kind() == reflect.String:
		fs.StringSlice(flag, nil, usage+" (a,b,… or the flag repeated)")
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			xs, _ := fs.GetStringSlice(flag)
			s := reflect.MakeSlice(base, len(xs), len(xs))
			for i, x := range xs {
				s.Index(i).Set(reflect.ValueOf(x).Convert(base.Elem()))
			}
			set(v, s)
			return nil
		}
	case base.Kind() == reflect.Map && base.Key().Kind() == reflect.String && base.Elem().Kind() == reflect.String:
		fs.StringToString(flag, nil, usage+" (key=value,…)")
		b.set = func(v reflect.Value, fs *pflag.FlagSet) error {
			m, _ := fs.GetStringToString(flag)
			set(v, reflect.ValueOf(m))
			return nil
		}
	default:
		return b, false // only through --json
	}
	return b, true
}

// kebab turns a JSON name into a flag name: memoryGiB → memory-gib, tenantId → tenant-id.
func kebab(s string) string {
	s = strings.ReplaceAll(s, "GiB", "Gib") // a unit, not two words
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			if i > 0 && (unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
