package fleetconfig

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
	"sigs.k8s.io/yaml"

	"github.com/better-compute/compute/api"
)

const goodDoc = `apiVersion: compute/v1
kind: FleetConfig
metadata:
  tenant: root
spec:
  manages: [sites, pools, quotas, webhooks]
  sites:
  - name: fra1
    displayName: Frankfurt 1
    labels: {region: eu}
  pools:
  - name: h100
    site: fra1
    description: eight H100s a node
    attestation: {tpm: "off"}
  quotas:
  - tenant: t1
    pool: h100
    resource: gpus
    model: h100
    limit: 16
  webhooks:
  - url: https://hooks.example.com/compute
    eventTypes: [node., fleet.drifted]
`

// TestParseNamesWhatIsWrong: every bad document is an invalid_argument whose details.field is
// the path of what is wrong, and whose message says it.
func TestParseNamesWhatIsWrong(t *testing.T) {
	t.Parallel()
	if _, err := Parse(goodDoc); err != nil {
		t.Fatalf("the good document: %v", err)
	}
	edit := func(old, new string) string {
		if !strings.Contains(goodDoc, old) {
			t.Fatalf("the good document has no %q", old)
		}
		return strings.Replace(goodDoc, old, new, 1)
	}
	cases := []struct {
		name, doc, field, message string
	}{
		{"not YAML", edit("  sites:\n", "  sites: [\n"), "document", "line"},
		{"empty", "  \n", "document", "empty"},
		{"two documents", goodDoc + "---\n" + goodDoc, "document", "more than one"},
		{"a list, not a mapping", "- a\n- b\n", "document", "mapping"},
		{"duplicate key", edit("    displayName: Frankfurt 1\n", "    displayName: Frankfurt 1\n    displayName: twice\n"), "document", "already set"},
		{"unknown top field", edit("kind: FleetConfig\n", "kind: FleetConfig\nstatus: {}\n"), "status", "unknown field"},
		{"unknown nested field", edit("    description:", "    descripton:"), "spec.pools[0].descripton", "unknown field"},
		{"field names are case-sensitive", edit("  - name: fra1", "  - Name: fra1"), "spec.sites[0].Name", "unknown field"},
		{"wrong type", edit("limit: 16", "limit: sixteen"), "spec.quotas[0].limit", "whole number"},
		{"not a whole number", edit("limit: 16", "limit: 1.5"), "spec.quotas[0].limit", "whole number"},
		{"unquoted off", edit(`{tpm: "off"}`, "{tpm: off}"), "spec.pools[0].attestation.tpm", "quote"},
		{"labels not a mapping", edit("labels: {region: eu}", "labels: [eu]"), "spec.sites[0].labels", "mapping"},
		{"wrong version", edit("compute/v1", "compute/v2"), "apiVersion", "compute/v1"},
		{"wrong kind", edit("kind: FleetConfig", "kind: Fleet"), "kind", "FleetConfig"},
		{"manages nothing", edit("  manages: [sites, pools, quotas, webhooks]\n", ""), "spec.manages", "required"},
		{"manages what is not", edit("[sites, pools, quotas, webhooks]", "[sites, pools, quotas, webhooks, nodes]"), "spec.manages[4]", "nodes"},
		{"lists what it does not manage", edit("[sites, pools, quotas, webhooks]", "[sites, pools, quotas]"), "spec.webhooks", "spec.manages"},
		{"bad name", edit("name: h100", "name: H100_x"), "spec.pools[0].name", "not a valid name"},
		{"bad site reference", edit("site: fra1", "site: Fra 1"), "spec.pools[0].site", "not a valid name"},
		{"bad label", edit("{region: eu}", "{'-bad': eu}"), "spec.sites[0].labels", "label key"},
		{"bad tpm", edit(`{tpm: "off"}`, `{tpm: always}`), "spec.pools[0].attestation.tpm", "always"},
		{"negative limit", edit("limit: 16", "limit: -1"), "spec.quotas[0].limit", "negative"},
		{"model of vcpus", edit("resource: gpus", "resource: vcpus"), "spec.quotas[0].model", "gpus only"},
		{"unknown resource", edit("resource: gpus", "resource: tpus"), "spec.quotas[0].resource", "tpus"},
		{"bad url", edit("https://hooks.example.com/compute", "ftp://hooks.example.com/compute"), "spec.webhooks[0].url", "scheme"},
		{"bad event type", edit("[node., fleet.drifted]", "[Node]"), "spec.webhooks[0].eventTypes", "event type"},
		{"a site twice", edit("  pools:\n", "  - name: fra1\n  pools:\n"), "spec.sites[1]", "spec.sites[0]"},
		{"NUL in a string", edit("Frankfurt 1", `"Frankfurt\0"`), "spec.sites[0].displayName", "NUL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.doc)
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeInvalidArgument {
				t.Fatalf("Parse = %v, want invalid_argument", err)
			}
			if got, _ := e.Details["field"].(string); got != c.field {
				t.Errorf("field = %q, want %q (%s)", got, c.field, e.Message)
			}
			if !strings.Contains(e.Message, c.message) {
				t.Errorf("message %q does not say %q", e.Message, c.message)
			}
		})
	}
}

// TestRenderRoundTrip: a document renders to YAML that parses back to itself, the same bytes
// every time, with the fields in the order of the types (name first) and "off" quoted.
func TestRenderRoundTrip(t *testing.T) {
	t.Parallel()
	cfg, err := Parse(goodDoc)
	if err != nil {
		t.Fatal(err)
	}
	text, err := Render(cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Render(cfg)
	if err != nil || again != text {
		t.Fatalf("two renders differ:\n%s\n%s", text, again)
	}
	back, err := Parse(text)
	if err != nil {
		t.Fatalf("the rendered document does not parse: %v\n%s", err, text)
	}
	if diff := cmp.Diff(cfg, back); diff != "" {
		t.Fatalf("round trip changed the document (-before +after):\n%s", diff)
	}
	for _, want := range []string{"apiVersion: compute/v1\nkind: FleetConfig\n", "  - name: h100\n    site: fra1\n", `tpm: "off"`} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered document lacks %q:\n%s", want, text)
		}
	}
}

// TestRenderCarriesAnyStoredText: Render writes whatever text the database holds, including
// text the API refuses today but stored before (a control character, a non-character), and the
// YAML reads back to the same strings; where the text is the API's, the document parses back to
// itself.
func TestRenderCarriesAnyStoredText(t *testing.T) {
	t.Parallel()
	texts := rapid.Custom(func(t *rapid.T) string {
		r := rapid.OneOf(rapid.SampledFrom([]rune{0x7f, 0x85, 0x9f, 0xfffe, 0xffff, 0x1b, 0x2028, 0xfeff, '"', ':', '#', '\n', ' '}), rapid.Rune())
		return string(rapid.SliceOfN(r, 1, 10).Draw(t, "runes"))
	})
	rapid.Check(t, func(t *rapid.T) {
		cfg, err := Parse(goodDoc)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Spec.Sites[0].DisplayName = texts.Draw(t, "displayName")
		cfg.Spec.Sites[0].Labels["region"] = texts.Draw(t, "label")
		cfg.Spec.Pools[0].Description = texts.Draw(t, "description")
		cfg.Spec.Webhooks[0].Description = texts.Draw(t, "webhook")
		text, err := Render(cfg)
		if err != nil {
			t.Fatalf("Render: %v", err)
		}
		var back api.FleetConfig
		if err := yaml.UnmarshalStrict([]byte(text), &back); err != nil {
			t.Fatalf("the rendered YAML does not read back: %v\n%s", err, text)
		}
		if diff := cmp.Diff(cfg, back); diff != "" {
			t.Fatalf("the YAML changed the document (-rendered +read):\n%s", diff)
		}
		if api.CheckInput(cfg) == nil {
			if _, err := Parse(text); err != nil {
				t.Fatalf("a document of the API's text does not parse back: %v\n%s", err, text)
			}
		}
	})
}
