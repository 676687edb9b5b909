package surface

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// root is the module's root, from this package's directory.
const root = "../../.."

// TestAPISurface fails when the API differs from api/surface.json: an addition needs the
// snapshot refreshed (go run ./internal/tools/cmd/surface), a breaking change a new api.Version too.
func TestAPISurface(t *testing.T) {
	t.Parallel()
	v, _, err := CheckAPI(root)
	if err != nil {
		t.Fatal(err)
	}
	if v.Stale() {
		t.Fatal(v.Message())
	}
}

// TestProtocolSurface is the same for agent/v1 and agent/v1/surface.txt.
func TestProtocolSurface(t *testing.T) {
	t.Parallel()
	v, _, err := CheckProtocol(root)
	if err != nil {
		t.Fatal(err)
	}
	if v.Stale() {
		t.Fatal(v.Message())
	}
}

// TestSnapshotsRoundTrip: the committed snapshot reads back to the surface it was written from.
func TestSnapshotsRoundTrip(t *testing.T) {
	t.Parallel()
	live, err := LiveAPI()
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeAPI(live)
	if err != nil {
		t.Fatal(err)
	}
	var back API
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(FlattenAPI(live), FlattenAPI(&back)); d != "" {
		t.Fatalf("the surface after a round trip (-live +read):\n%s", d)
	}
	if len(live.Methods) < 60 || len(FlattenAPI(live)) < 1000 {
		t.Fatalf("a surface of %d methods, %d elements: too small to be the API", len(live.Methods), len(FlattenAPI(live)))
	}
}

// TestAPIChanges: what counts as breaking and what as an addition, on the real surface changed
// as a developer would change it.
func TestAPIChanges(t *testing.T) {
	t.Parallel()
	base, err := LiveAPI()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		change          func(*API)
		breaking, added []string
	}{
		{"nothing", func(*API) {}, nil, nil},
		{"a field of an output removed", func(a *API) { delete(a.Types["api.Site"].Properties, "labels") },
			[]string{"sites.create output.labels (map) removed", "sites.create output.labels{} (string) removed"}, nil},
		{"a field of an input renamed", func(a *API) {
			p := a.Types["api.CreatePool"].Properties
			p["displayTitle"], p["displayName"] = p["displayName"], nil
			delete(p, "displayName")
		}, []string{"pools.create input.displayName (string) removed"}, []string{"pools.create input.displayTitle (string)"}},
		{"a field of another type", func(a *API) { a.Types["api.Site"].Properties["name"] = &Schema{Type: "integer"} },
			[]string{"sites.create output.name: integer, was string"}, nil},
		{"a field added to an input", func(a *API) { a.Types["api.CreateSite"].Properties["region"] = &Schema{Type: "string"} },
			nil, []string{"sites.create input.region (string)"}},
		{"a method removed", func(a *API) {
			a.Methods = slices.DeleteFunc(a.Methods, func(m Method) bool { return m.Name == "sites.delete" })
		}, []string{"method sites.delete (mutating=true action=compute:sites:delete resource=compute-site) removed"}, nil},
		{"a read made a mutation", func(a *API) {
			for i := range a.Methods {
				if a.Methods[i].Name == "sites.get" {
					a.Methods[i].Mutating = true
				}
			}
		}, []string{"method sites.get: mutating=true action=compute:sites:get resource=compute-site, was mutating=false action=compute:sites:get resource=compute-site"}, nil},
		{"a method added", func(a *API) {
			a.Methods = append(a.Methods, Method{Name: "sites.rename", Mutating: true, Action: "compute:sites:rename", Resource: "compute-site",
				Input: &Schema{Type: "object", Properties: map[string]*Schema{"site": {Type: "string"}}}, Output: &Schema{Ref: "#/types/api.Site"}})
		}, nil, []string{"method sites.rename (mutating=true action=compute:sites:rename resource=compute-site)", "sites.rename input (object)",
			"sites.rename input.site (string)", "sites.rename output (object)"}},
		{"a type renamed, its JSON the same", func(a *API) {
			a.Types["api.NewSite"] = a.Types["api.CreateSite"]
			delete(a.Types, "api.CreateSite")
			for i := range a.Methods {
				if a.Methods[i].Input.Ref == "#/types/api.CreateSite" {
					a.Methods[i].Input = &Schema{Ref: "#/types/api.NewSite"}
				}
			}
		}, nil, nil},
		{"an error code removed", func(a *API) { delete(a.Codes, "quota_exceeded") }, []string{"code quota_exceeded (http=429) removed"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := clone(t, base)
			tc.change(changed)
			c := DiffAPI(base, changed)
			// Only the first lines of a change that reaches many methods are compared.
			if d := cmp.Diff(tc.breaking, firstOf(c.Breaking, tc.breaking)); d != "" {
				t.Errorf("breaking (-want +got):\n%s\nall:\n%s", d, c)
			}
			if d := cmp.Diff(tc.added, firstOf(c.Added, tc.added)); d != "" {
				t.Errorf("added (-want +got):\n%s\nall:\n%s", d, c)
			}
			v := Verdict{Changes: c, Snapshot: 1, Version: 1}
			if v.Refused() != (len(tc.breaking) > 0) {
				t.Errorf("refused: %v", v.Refused())
			}
			v.Version = 2
			if v.Refused() {
				t.Error("refused with a new version")
			}
		})
	}
}

// firstOf is the lines of got that want's lines pick out: those with the same method as want's,
// so that a change seen through many methods is compared by the ones named.
func firstOf(got, want []string) []string {
	if want == nil {
		if len(got) == 0 {
			return nil
		}
		return got
	}
	var out []string
	for _, g := range got {
		for _, w := range want {
			if g == w {
				out = append(out, g)
			}
		}
	}
	return out
}

func clone(t *testing.T, a *API) *API {
	t.Helper()
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var c API
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// TestProtocolChanges: a field renumbered, retyped or removed breaks; one added does not.
func TestProtocolChanges(t *testing.T) {
	t.Parallel()
	_, base, err := ParseProtocol(LiveProtocol())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		change          func(map[string]string)
		breaking, added int
	}{
		{"a field renumbered", func(m map[string]string) {
			m["field agent.v1.Heartbeat.9"] = m["field agent.v1.Heartbeat.1"]
			delete(m, "field agent.v1.Heartbeat.1")
		}, 1, 1},
		{"a field retyped", func(m map[string]string) { m["field agent.v1.Heartbeat.1"] = "applied_generation int32" }, 1, 0},
		{"a field renamed", func(m map[string]string) { m["field agent.v1.Heartbeat.1"] = "generation int64" }, 1, 0},
		{"a message removed", func(m map[string]string) {
			delete(m, "message agent.v1.Goodbye")
			delete(m, "field agent.v1.Goodbye.1")
		}, 2, 0},
		{"an rpc made unary", func(m map[string]string) {
			m["rpc agent.v1.SessionService.Connect"] = "agent.v1.NodeMessage -> agent.v1.ServerMessage"
		}, 1, 0},
		{"a field added", func(m map[string]string) { m["field agent.v1.Heartbeat.3"] = "uptime_seconds int64" }, 0, 1},
		{"a message added", func(m map[string]string) { m["message agent.v1.Drain"] = "" }, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := map[string]string{}
			for k, v := range base {
				changed[k] = v
			}
			tc.change(changed)
			c := Diff(base, changed)
			if len(c.Breaking) != tc.breaking || len(c.Added) != tc.added {
				t.Fatalf("%d breaking, %d added; want %d, %d:\n%s", len(c.Breaking), len(c.Added), tc.breaking, tc.added, c)
			}
		})
	}
}

// TestTheCommittedProtocolSurfaceIsReadable: agent/v1/surface.txt parses, with the version of
// the code, and names SessionService.Connect as the bidirectional stream it is.
func TestTheCommittedProtocolSurfaceIsReadable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, ProtocolPath))
	if err != nil {
		t.Fatal(err)
	}
	v, elems, err := ParseProtocol(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if v != 1 || !strings.HasPrefix(elems["rpc agent.v1.SessionService.Connect"], "stream agent.v1.NodeMessage -> stream ") {
		t.Fatalf("version %d, Connect %q", v, elems["rpc agent.v1.SessionService.Connect"])
	}
}
