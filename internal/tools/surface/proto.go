package surface

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// LiveProtocol is the node protocol's surface as built: agent/v1/surface.txt. Each line is one
// element, "key: value" (or a bare key), sorted by key: services, RPCs with their messages and
// streaming, messages, fields by number with name, cardinality, type and oneof, enums and their
// values by number. A key that disappears or whose value changes is a breaking change; a new
// key is an addition.
func LiveProtocol() string {
	var lines []string
	add := func(key, value string) {
		if value != "" {
			key += ": " + value
		}
		lines = append(lines, key)
	}
	fd := agentv1.File_agent_proto
	for i := range fd.Services().Len() {
		sd := fd.Services().Get(i)
		add("service "+string(sd.FullName()), "")
		for j := range sd.Methods().Len() {
			md := sd.Methods().Get(j)
			add("rpc "+string(md.FullName()), stream(md.IsStreamingClient())+string(md.Input().FullName())+" -> "+
				stream(md.IsStreamingServer())+string(md.Output().FullName()))
		}
	}
	var messages func(protoreflect.MessageDescriptors)
	messages = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			m := ms.Get(i)
			add("message "+string(m.FullName()), "")
			for j := range m.Fields().Len() {
				f := m.Fields().Get(j)
				add(fmt.Sprintf("field %s.%d", m.FullName(), f.Number()), field(f))
			}
			messages(m.Messages())
			enums(m.Enums(), add)
		}
	}
	messages(fd.Messages())
	enums(fd.Enums(), add)
	sort.Strings(lines)
	return fmt.Sprintf("# The surface of the node protocol (agent/v1/agent.proto), written by go run ./internal/tools/cmd/surface.\n"+
		"# A line removed or changed breaks agents or gateways of other versions: it needs a new\n"+
		"# agentv1.ProtocolVersion (docs/compatibility.md). A line added is an addition.\n"+
		"version: %d\n%s\n", agentv1.ProtocolVersion, strings.Join(lines, "\n"))
}

func stream(s bool) string {
	if s {
		return "stream "
	}
	return ""
}

// field is a field's name, cardinality, type and oneof.
func field(f protoreflect.FieldDescriptor) string {
	var b strings.Builder
	b.WriteString(string(f.Name()))
	switch {
	case f.IsMap():
		fmt.Fprintf(&b, " map<%s, %s>", kind(f.MapKey()), kind(f.MapValue()))
	case f.Cardinality() == protoreflect.Repeated:
		b.WriteString(" repeated " + kind(f))
	default:
		b.WriteString(" " + kind(f))
	}
	if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
		b.WriteString(" oneof " + string(o.Name()))
	}
	if f.HasPresence() && f.ContainingOneof() == nil && f.Kind() != protoreflect.MessageKind && f.Kind() != protoreflect.GroupKind {
		b.WriteString(" optional")
	}
	return b.String()
}

func kind(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return string(f.Message().FullName())
	case protoreflect.EnumKind:
		return string(f.Enum().FullName())
	}
	return f.Kind().String()
}

func enums(es protoreflect.EnumDescriptors, add func(key, value string)) {
	for i := range es.Len() {
		e := es.Get(i)
		add("enum "+string(e.FullName()), "")
		for j := range e.Values().Len() {
			v := e.Values().Get(j)
			add(fmt.Sprintf("value %s.%d", e.FullName(), v.Number()), string(v.Name()))
		}
	}
}

// ParseProtocol reads a protocol surface back: its version and its elements, key to value.
func ParseProtocol(text string) (version int, elems map[string]string, err error) {
	elems = map[string]string{}
	version = -1
	for n, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, ": ")
		if k == "version" {
			if _, err := fmt.Sscanf(v, "%d", &version); err != nil {
				return 0, nil, fmt.Errorf("line %d: the version %q: %w", n+1, v, err)
			}
			continue
		}
		if _, dup := elems[k]; dup {
			return 0, nil, fmt.Errorf("line %d: %q twice", n+1, k)
		}
		elems[k] = v
	}
	if version < 0 {
		return 0, nil, fmt.Errorf("no version line")
	}
	return version, elems, nil
}
