package releases_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/releases"
	"github.com/better-compute/compute/internal/core/releases/releasetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func wantCode(t *testing.T, what string, err error, code api.Code, contains string) {
	t.Helper()
	if api.CodeOf(err) != code || !strings.Contains(err.Error(), contains) {
		t.Fatalf("%s = %v, want %s containing %q", what, err, code, contains)
	}
}

var (
	v1linux = tufrepo.Build{Version: "v1.0.0", OS: "linux", Arch: "amd64"}
	v1arm   = tufrepo.Build{Version: "v1.0.0", OS: "linux", Arch: "arm64"}
)

// TestRepository installs a root, uploads and publishes builds, and checks what the control
// plane refuses: roots that do not delegate to its online keys or do not follow the current one,
// targets not signed by the offline targets key (its own online keys included), out of order,
// or naming bytes it does not hold; and callers outside the root tenant.
func TestRepository(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	url := env.Server(t)
	a := env.Compute.API
	_, err := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleRoot})
	wantCode(t, "releases.metadata before a root", err, api.CodeNotFound, "releases init")
	_, err = a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: []byte(`{}`)})
	wantCode(t, "releases.publish before a root", err, api.CodeFailedPrecondition, "no root")

	// A root whose timestamp role is not the control plane's key.
	keys, err := a.Releases.Keys(ctx, env.RootKey, api.GetReleaseKeys{})
	if err != nil {
		t.Fatal(err)
	}
	r := releasetest.Init(t, env, url) // the offline keys, and root 1
	bad := r.Keys(t, keys)
	bad.Timestamp = bad.Snapshot
	root, _ := tufrepo.SignRoot(2, bad, time.Now().Add(time.Hour), r.RootKey)
	_, err = a.Releases.SetRoot(ctx, env.RootKey, api.SetReleaseRoot{Root: root})
	wantCode(t, "a root not delegating timestamp to the online key", err, api.CodeInvalidArgument, "releases.keys")
	// Root 1 again, and a root 2 signed by another key than root 1's.
	root, _ = tufrepo.SignRoot(1, r.Keys(t, keys), time.Now().Add(time.Hour), r.RootKey)
	_, err = a.Releases.SetRoot(ctx, env.RootKey, api.SetReleaseRoot{Root: root})
	wantCode(t, "root 1 again", err, api.CodeInvalidArgument, "does not follow")
	stranger, _, _ := tufrepo.OnlineKeys("another control plane's secret, 32+ characters")
	root, _ = tufrepo.SignRoot(2, r.Keys(t, keys), time.Now().Add(time.Hour), stranger)
	_, err = a.Releases.SetRoot(ctx, env.RootKey, api.SetReleaseRoot{Root: root})
	wantCode(t, "root 2 not signed by root 1's key", err, api.CodeInvalidArgument, "does not follow")
	// A tenant's administrator may not change what every tenant's nodes install.
	_, tenantKey := env.Tenant(t, "acme")
	_, err = a.Releases.SetRoot(ctx, tenantKey, api.SetReleaseRoot{Root: root})
	wantCode(t, "releases.setRoot from another tenant", err, api.CodePermissionDenied, "root tenant")

	// Uploads: bytes that are not what the ticket names are refused.
	data := []byte("#!/bin/sh\necho bcd v1.0.0\n")
	sum := sha256.Sum256(data)
	tk, err := a.Releases.Upload(ctx, env.RootKey, api.UploadBuild{Version: "v1.0.0", OS: "linux", Arch: "amd64", Length: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	if err != nil || tk.Held || tk.URL == "" {
		t.Fatalf("releases.upload = %+v, %v", tk, err)
	}
	put := func(target string, body []byte) (int, string) {
		req, _ := http.NewRequest(http.MethodPut, url+target, bytes.NewReader(body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		return res.StatusCode, b.String()
	}
	if code, body := put(tk.URL, bytes.ToUpper(data)); code != http.StatusBadRequest || !strings.Contains(body, "SHA-256") {
		t.Fatalf("other bytes of the same length = %d %s", code, body)
	}
	if code, body := put(tk.URL, append(data, 'x')); code != http.StatusBadRequest || !strings.Contains(body, "longer") {
		t.Fatalf("a longer body = %d %s", code, body)
	}
	if code, body := put(api.BasePath+api.ReleaseUploadPath+"?ticket=forged", data); code != http.StatusUnauthorized {
		t.Fatalf("a forged ticket = %d %s", code, body)
	}
	if code, body := put(tk.URL, data); code != http.StatusOK {
		t.Fatalf("the upload = %d %s", code, body)
	}
	if tk, err := a.Releases.Upload(ctx, env.RootKey, api.UploadBuild{Version: "v1.0.0", OS: "linux", Arch: "amd64", Length: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}); err != nil || !tk.Held {
		t.Fatalf("releases.upload of held bytes = %+v, %v", tk, err)
	}

	// Targets: signed by the control plane's own online key, they are refused (it holds no
	// targets key); naming bytes not uploaded, refused; then published.
	snapKey, _, _ := tufrepo.OnlineKeys(computetest.Secret)
	builds := map[tufrepo.Build][]byte{v1linux: data}
	_, err = a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: r.Targets(t, builds, snapKey, time.Now().Add(time.Hour))})
	wantCode(t, "targets signed by the online snapshot key", err, api.CodeInvalidArgument, "targets keys")
	withArm := map[tufrepo.Build][]byte{v1linux: data, v1arm: []byte("arm build")}
	_, err = a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: r.Targets(t, withArm, r.TargetsKey, time.Now().Add(time.Hour))})
	wantCode(t, "targets naming bytes not uploaded", err, api.CodeFailedPrecondition, "has not been uploaded")
	_, err = a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: r.Targets(t, builds, r.TargetsKey, time.Now().Add(-time.Hour))})
	wantCode(t, "expired targets", err, api.CodeInvalidArgument, "expired")
	signed := r.Targets(t, builds, r.TargetsKey, time.Now().Add(time.Hour))
	p, err := a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: signed})
	if err != nil {
		t.Fatal(err)
	}
	if p.Targets != 1 || p.Snapshot != 1 || p.Timestamp != 1 || len(p.Added) != 1 || p.Added[0].Version != "v1.0.0" ||
		len(p.Added[0].Builds) != 1 || p.Added[0].Builds[0].SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("published %+v", p)
	}
	_, err = a.Releases.Publish(ctx, env.RootKey, api.PublishTargets{Targets: signed})
	wantCode(t, "the same targets again", err, api.CodeInvalidArgument, "does not follow")

	// A second release; the list is newest first.
	p = r.Publish(t, map[tufrepo.Build][]byte{{Version: "v1.1.0", OS: "linux", Arch: "amd64"}: []byte("bcd v1.1.0")})
	if p.Targets != 2 || len(p.Added) != 1 || p.Added[0].Version != "v1.1.0" {
		t.Fatalf("published %+v", p)
	}
	page, err := a.Releases.List(ctx, env.RootKey, api.ListReleases{PageRequest: api.PageRequest{Limit: 1}})
	if err != nil || len(page.Items) != 1 || page.Items[0].Version != "v1.1.0" || page.NextCursor == "" {
		t.Fatalf("releases.list = %+v, %v", page, err)
	}
	page, err = a.Releases.List(ctx, env.RootKey, api.ListReleases{PageRequest: api.PageRequest{Cursor: page.NextCursor}})
	if err != nil || len(page.Items) != 1 || page.Items[0].Version != "v1.0.0" || page.NextCursor != "" {
		t.Fatalf("releases.list, page 2 = %+v, %v", page, err)
	}
	if rel, err := a.Releases.Get(ctx, tenantKey, api.GetRelease{Version: "v1.0.0"}); err != nil || rel.Builds[0].Target != "bcd-v1.0.0-linux-amd64" {
		t.Fatalf("releases.get from a tenant = %+v, %v", rel, err)
	}
	_, err = a.Releases.Get(ctx, env.RootKey, api.GetRelease{Version: "v9"})
	wantCode(t, "releases.get of an unknown version", err, api.CodeNotFound, "v9")

	// Half of the timestamp's life later, the worker signs a new one; the snapshot stays.
	ts, _ := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleTimestamp})
	env.DB.SetNow(time.Now().Add(13 * time.Hour))
	if err := releases.Refresh(ctx, env.DB, computetest.Secret); err != nil {
		t.Fatal(err)
	}
	ts2, _ := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleTimestamp})
	snap, _ := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleSnapshot})
	if ts2.Version != ts.Version+1 || !ts2.ExpiresAt.After(ts.ExpiresAt) || snap.Version != 2 {
		t.Fatalf("after 13 hours: timestamp %d (was %d), snapshot %d", ts2.Version, ts.Version, snap.Version)
	}
	if err := releases.Refresh(ctx, env.DB, computetest.Secret); err != nil {
		t.Fatal(err)
	}
	if ts3, _ := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleTimestamp}); ts3.Version != ts2.Version {
		t.Fatalf("a fresh timestamp was signed again: %d", ts3.Version)
	}
	env.DB.SetNow(time.Now().Add(4 * 24 * time.Hour))
	if err := releases.Refresh(ctx, env.DB, computetest.Secret); err != nil {
		t.Fatal(err)
	}
	if s, _ := a.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleSnapshot}); s.Version != 3 {
		t.Fatalf("after four days the snapshot is %d, want 3", s.Version)
	}
	env.DB.ResetNow()
}

// TestNodesFetchOverTheirTLS checks the repository as nodes reach it: through the gateway, with
// a node's certificate only, and verified by the TUF client bcd uses.
func TestNodesFetchOverTheirTLS(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	a := env.Compute.API
	r := releasetest.Init(t, env, url)
	data := []byte("bcd v1.0.0 for linux/amd64")
	r.Publish(t, map[tufrepo.Build][]byte{v1linux: data})
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p1"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := nodeagent.JoinWith(ctx, nodeagent.JoinOptions{URL: url, Token: jt.Token, CAHash: jt.CAHash,
		Facts: &agentv1.MachineFacts{Hostname: "n1", MachineId: "m-n1"}})
	if err != nil {
		t.Fatal(err)
	}
	hc, err := nodeagent.GatewayHTTP(id)
	if err != nil {
		t.Fatal(err)
	}
	c := &tufrepo.Client{BaseURL: "https://" + gw, HTTP: hc, Dir: t.TempDir()}
	dst := filepath.Join(t.TempDir(), "bcd")
	if _, err := c.Fetch(ctx, v1linux, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, data) {
		t.Fatalf("fetched %q", b)
	}
	if _, err := metadata.Root().FromFile(filepath.Join(c.Dir, "root.json")); err != nil {
		t.Fatalf("the node keeps no trusted root: %v", err)
	}

	// Without a node's certificate, nothing is served.
	plain := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	res, err := plain.Get("https://" + gw + tufrepo.MetadataPath + "1.root.json")
	if err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("without a client certificate: %s", res.Status)
		}
	}
	// A retired node's certificate is revoked: refused once the gateway knows.
	if _, err := a.Nodes.Retire(ctx, env.RootKey, api.RetireNode{NodeRef: api.NodeRef{Node: id.NodeID}}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 20*time.Second, "a retired node's certificate refused", func() bool {
		res, err := hc.Get("https://" + gw + tufrepo.MetadataPath + "timestamp.json")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusForbidden
	})
}
