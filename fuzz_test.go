package compute_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/fleet"
)

// fuzzFleet is what the method fuzz target's examples refer to: a site, a pool with one node of
// eight GPUs, and a second tenant.
type fuzzFleet struct {
	env       *computetest.Env
	nodeID    string
	webhookID string // a webhook that exists, so that list filters reach the database
}

func newFuzzFleet(f testing.TB) *fuzzFleet { return newFuzzFleetWith(f, computetest.Options{}) }

func newFuzzFleetWith(f testing.TB, opts computetest.Options) *fuzzFleet {
	env := computetest.New(f, opts)
	ctx := context.Background()
	a := env.Compute.API
	if _, err := a.Sites.Create(ctx, env.RootKey, api.CreateSite{Name: "s1"}); err != nil {
		f.Fatal(err)
	}
	p, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p1", Site: "s1"})
	if err != nil {
		f.Fatal(err)
	}
	env.Tenant(f, "t1")
	n, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: p.ID, Name: "n1"})
	if err != nil {
		f.Fatal(err)
	}
	if _, err := env.DB.Pool.Exec(ctx, `UPDATE compute.nodes SET status = 'online', health = 'healthy' WHERE id = $1`, n.ID); err != nil {
		f.Fatal(err)
	}
	inv := capacity.Inventory{VCPUs: 64, MemoryGiB: 512}
	for g := range 8 {
		inv.GPUs = append(inv.GPUs, capacity.GPU{Index: g, UUID: fmt.Sprintf("GPU-n1-%d", g), Name: "NVIDIA H100 80GB HBM3",
			MemoryMiB: 81559, NVLinkDomain: "n1-nv"})
	}
	if err := capacity.SetInventory(ctx, env.DB.Pool, n.ID, inv); err != nil {
		f.Fatal(err)
	}
	wh, err := a.Webhooks.Create(ctx, env.RootKey, api.CreateWebhook{URL: "https://hooks.example.com/fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	return &fuzzFleet{env: env, nodeID: n.ID, webhookID: wh.ID}
}

const fuzzID = "0190a0b0-0000-7000-8000-000000000001" // an id that names nothing

// fuzzSSHKey is an SSH public key for access.sshCertificate.
const fuzzSSHKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"

// examples returns a valid input of every core method.
func (ff *fuzzFleet) examples() map[string]string {
	node := ff.nodeID
	return map[string]string{
		"sites.create":              `{"name":"s2","displayName":"Site two","labels":{"rack":"a1"}}`,
		"sites.get":                 `{"site":"s1"}`,
		"sites.list":                `{"limit":10}`,
		"sites.update":              `{"site":"s1","displayName":"Site one","labels":{"rack":"b2"}}`,
		"sites.delete":              `{"site":"s9"}`,
		"pools.create":              `{"name":"p2","site":"s1","description":"spare","labels":{"tier":"gold"}}`,
		"pools.get":                 `{"pool":"p1"}`,
		"pools.list":                `{"site":"s1","limit":5}`,
		"pools.update":              `{"pool":"p1","description":"main","labels":{"tier":"gold"}}`,
		"pools.delete":              `{"pool":"p9"}`,
		"nodes.get":                 `{"node":"n1","pool":"p1"}`,
		"nodes.list":                `{"pool":"p1","state":"active","role":"node"}`,
		"nodes.cordon":              `{"node":"n9","pool":"p1"}`,
		"nodes.uncordon":            `{"node":"n1","pool":"p1"}`,
		"nodes.drain":               `{"node":"n9","pool":"p1","end":true}`,
		"nodes.retire":              `{"node":"` + fuzzID + `"}`,
		"nodes.setLabels":           `{"node":"n1","pool":"p1","labels":{"zone":"z1"}}`,
		"nodes.drainMany":           `{"pool":"p1","nodes":["n1","` + node + `"],"end":true,"approval":"` + fuzzID + `"}`,
		"nodes.retireMany":          `{"pool":"p1","nodes":["n9"],"approval":"` + fuzzID + `"}`,
		"quorum.get":                `{"tenantId":"t1"}`,
		"quorum.set":                `{"tenantId":"t1","maxNodes":4,"maxPercent":25,"approvers":2,"ttl":"30m"}`,
		"approvals.list":            `{"state":"pending","limit":3}`,
		"approvals.get":             `{"approval":"` + fuzzID + `"}`,
		"approvals.approve":         `{"approval":"` + fuzzID + `","comment":"ok"}`,
		"approvals.deny":            `{"approval":"` + fuzzID + `","comment":"no"}`,
		"reservations.create":       `{"pool":"p1","gpus":1,"model":"h100","start":"2030-01-01T00:00:00Z","duration":"1h","requireLabels":{"zone":"z1"},"labels":{"job":"train"}}`,
		"reservations.get":          `{"reservation":"` + fuzzID + `"}`,
		"reservations.list":         `{"pool":"p1","state":"pending","limit":2}`,
		"reservations.cancel":       `{"reservation":"` + fuzzID + `"}`,
		"reservations.release":      `{"reservation":"` + fuzzID + `"}`,
		"reservations.extend":       `{"reservation":"` + fuzzID + `","end":"2031-01-01T00:00:00Z"}`,
		"reservations.availability": `{"pool":"p1","gpus":2,"duration":"2h","after":"2030-01-01T00:00:00Z","horizon":"48h"}`,
		"capacity.summary":          `{"pool":"p1"}`,
		"capacity.search":           `{"pool":"p1","start":"2030-01-01T00:00:00Z","end":"2030-01-02T00:00:00Z"}`,
		"quotas.set":                `{"tenantId":"t1","pool":"p1","resource":"gpus","model":"h100","limit":4}`,
		"quotas.list":               `{"tenantId":"t1","limit":1}`,
		"quotas.delete":             `{"tenantId":"t1","pool":"p1","resource":"vcpus"}`,
		"devices.list":              `{"node":"` + node + `"}`,
		"devices.setMode":           `{"device":"GPU-n1-7","mode":"timeslice","shares":4}`,
		"devices.map":               `{"pool":"p1","limit":2}`,
		"joinTokens.create":         `{"pool":"p1","maxUses":2,"ttl":"1h","description":"rack a","role":"node"}`,
		"joinTokens.list":           `{"pool":"p1"}`,
		"joinTokens.revoke":         `{"token":"` + fuzzID + `"}`,
		"commands.create":           `{"node":"` + node + `","kind":"gpu.reset","args":{"gpu":0},"deadline":"1m","secret":{"token":"s"}}`,
		"commands.get":              `{"command":"` + fuzzID + `"}`,
		"commands.list":             `{"node":"` + node + `","state":"pending"}`,
		"commands.cancel":           `{"command":"` + fuzzID + `"}`,
		"events.list":               `{"after":3,"type":"node.","subject":"` + node + `","limit":10}`,
		"webhooks.create":           `{"url":"https://hooks.example.com/compute","eventTypes":["node.","reservation.created"],"description":"ops"}`,
		"webhooks.list":             `{"limit":3}`,
		"webhooks.delete":           `{"webhook":"` + fuzzID + `"}`,
		"webhooks.test":             `{"webhook":"` + fuzzID + `"}`,
		"webhooks.rotateSecret":     `{"webhook":"` + ff.webhookID + `","keepPrevious":"1500ms"}`,
		"webhooks.deliveries":       `{"webhook":"` + ff.webhookID + `","state":"dead","eventType":"node.offline","eventId":4,"limit":5}`,
		"webhooks.redeliver":        `{"delivery":7}`,
		"access.sshCA":              `{}`,
		"access.sshCertificate":     `{"reservation":"` + fuzzID + `","publicKey":"` + fuzzSSHKey + `","ttl":"5m","breakGlass":true,"reason":"pager"}`,
		"access.revoke":             `{"serial":12}`,
		"access.exec":               `{"node":"` + node + `","command":["/bin/sh","-c","true"],"tty":true,"cols":80,"rows":24}`,
		"access.console":            `{"reservation":"` + fuzzID + `","node":"n1","console":"ttyS0"}`,
		"workflows.get":             `{"run":"` + fuzzID + `"}`,
		"workflows.list":            `{"workflow":"metal.deploy","subject":"` + node + `","state":"running","limit":4}`,
		"workflows.cancel":          `{"run":"` + fuzzID + `"}`,
		"audit.checkpoint":          `{}`,
		"audit.proveInclusion":      `{"seq":1,"size":2}`,
		"audit.proveConsistency":    `{"from":1,"to":2}`,
		"fleet.export":              `{}`,
		"fleet.plan":                `{"document":"apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [sites, pools]\n  sites: [{name: s1, labels: {rack: a1}}]\n  pools: [{name: p1, site: s1}]\n","prune":true}`,
		"fleet.apply":               `{"document":"apiVersion: compute/v1\nkind: FleetConfig\nspec:\n  manages: [quotas]\n  quotas: [{tenant: t1, pool: p1, resource: gpus, limit: 2}]\n","fingerprint":"sha256:` + strings.Repeat("0", 64) + `","prune":true}`,
		"fleet.drift":               `{}`,
		"releases.keys":             `{}`,
		"releases.setRoot":          `{"root":{"signed":{"_type":"root","version":1},"signatures":[]}}`,
		"releases.upload":           `{"version":"v1.0.0","os":"linux","arch":"amd64","length":1024,"sha256":"` + strings.Repeat("ab", 32) + `"}`,
		"releases.publish":          `{"targets":{"signed":{"_type":"targets","version":1},"signatures":[]}}`,
		"releases.get":              `{"version":"v1.0.0"}`,
		"releases.list":             `{"limit":5}`,
		"releases.metadata":         `{"role":"timestamp"}`,
		"rollouts.create":           `{"pool":"p1","release":"v1.0.0","maxUnavailable":2,"waveDeadline":"10m","onFailure":"rollback"}`,
		"rollouts.get":              `{"rollout":"` + fuzzID + `"}`,
		"rollouts.list":             `{"pool":"p1","state":"running","limit":3}`,
		"rollouts.pause":            `{"rollout":"` + fuzzID + `"}`,
		"rollouts.resume":           `{"rollout":"` + fuzzID + `"}`,
		"rollouts.rollback":         `{"rollout":"` + fuzzID + `"}`,
	}
}

// variants returns bad versions of a valid example: every value replaced by what once reached
// the database (NUL, integers past int4, far dates, bad UTF-8), plus cursors and tenants.
func variants(example string) []string {
	var obj map[string]any
	if err := json.Unmarshal([]byte(example), &obj); err != nil {
		panic(err)
	}
	out := []string{example}
	add := func(o map[string]any) {
		b, err := json.Marshal(o)
		if err != nil {
			panic(err)
		}
		out = append(out, string(b))
	}
	with := func(k string, v any) map[string]any {
		o := make(map[string]any, len(obj)+1)
		for k, v := range obj {
			o[k] = v
		}
		o[k] = v
		return o
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch v := obj[k].(type) {
		case string:
			add(with(k, v+"\x00"))
			if _, err := time.Parse(time.RFC3339, v); err == nil {
				for _, far := range []string{"9999-12-31T23:59:59Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00Z", "1900-01-01T00:00:00Z"} {
					add(with(k, far))
				}
			}
		case float64:
			for _, n := range []json.Number{"2147483647", "2147483648", "-2147483649", "9223372036854775807", "-9223372036854775808", "1e30"} {
				add(with(k, n))
			}
		case map[string]any:
			add(with(k, map[string]any{"a\x00": "b"}))
			add(with(k, map[string]any{"a": "b\x00"}))
		}
	}
	add(with("tenantId", "\x00"))
	add(with("tenantId", strings.Repeat("t", 300)))
	for _, c := range []string{"q1:\x00", "q1:\xff", "r1:" + fuzzID + "\x00", "v1:x", "%%%"} {
		add(with("cursor", base64.RawURLEncoding.EncodeToString([]byte(c))))
	}
	// Cursors of every kind whose numbers are past what a column holds: a cursor is the
	// client's to forge.
	for _, kind := range []string{"e1", "rl1", "whd1", "wh1", "ro1", "wf1", "ap1", "jt1", "q1", "mm1"} {
		for _, key := range []string{"2147483648/v1", "9223372036854775808", "-1/x", "-9223372036854775808"} {
			add(with("cursor", api.EncodeCursor(kind, key)))
		}
	}
	// Raw bytes that are not UTF-8 inside a string (Go's JSON replaces them, but a client may send them).
	out = append(out, strings.Replace(example, `":"`, "\":\"\xff\xfe", 1))
	return out
}

// FuzzMethodInputs posts fuzzed JSON to every method of the registry, with a root key, and
// requires that no input ever gets a 5xx, that every error is the error envelope with a code
// that matches the status, and that every success has a JSON body.
func FuzzMethodInputs(f *testing.F) {
	ff := newFuzzFleet(f)
	h := ff.env.Compute.Handler
	methods := ff.env.Compute.Methods()
	examples := ff.examples()
	for _, m := range methods {
		ex, ok := examples[m.FullName()]
		if !ok {
			f.Fatalf("method %s has no example input in the fuzz target: add one", m.FullName())
		}
		for _, body := range variants(ex) {
			f.Add(m.FullName(), []byte(body), "")
		}
		if m.FullName() == "devices.setMode" { // refs that are, look like or are not ids
			for _, ref := range []string{"abc", "GPU-n1-0", fuzzID, strings.ToUpper(fuzzID), "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", "{" + fuzzID[:34] + "}"} {
				for range 6 { // past PostgreSQL's switch to a generic plan
					f.Add(m.FullName(), []byte(`{"device":"`+ref+`","mode":"whole"}`), "")
				}
			}
		}
		if m.Mutating {
			for _, key := range []string{"k\xff\xfe", "k\x00", "k\n", strings.Repeat("k", 201), "ok-key"} {
				f.Add(m.FullName(), []byte(ex), key)
			}
		}
	}
	f.Fuzz(func(t *testing.T, method string, body []byte, key string) {
		i := slices.IndexFunc(methods, func(m api.MethodInfo) bool { return m.FullName() == method })
		if i < 0 {
			i = len(method) % len(methods)
		}
		m := methods[i]
		req := httptest.NewRequest(http.MethodPost, m.Path(), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+ff.env.RootKey)
		if key != "" {
			req.Header[api.IdempotencyKeyHeader] = []string{key}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, m.FullName(), body, rec)
	})
}

func checkAnswer(t *testing.T, method string, body []byte, rec *httptest.ResponseRecorder) {
	t.Helper()
	raw := rec.Body.Bytes()
	if rec.Code >= 500 {
		t.Fatalf("%s %q answered %d: %s", method, body, rec.Code, raw)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %q answered with Content-Type %q", method, body, ct)
	}
	if rec.Code < 300 {
		if !json.Valid(raw) || len(bytes.TrimSpace(raw)) == 0 {
			t.Fatalf("%s %q answered %d with a body that is not JSON: %q", method, body, rec.Code, raw)
		}
		return
	}
	var e struct {
		Error *api.Error `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == nil {
		t.Fatalf("%s %q answered %d with a body that is not an error envelope (%v): %q", method, body, rec.Code, err, raw)
	}
	if !slices.Contains(api.Codes, e.Error.Code) || e.Error.Message == "" {
		t.Fatalf("%s %q answered an error without a known code and a message: %q", method, body, raw)
	}
	if want := e.Error.Code.HTTPStatus(); want != rec.Code && rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("%s %q answered %d with code %s, whose status is %d", method, body, rec.Code, e.Error.Code, want)
	}
}
