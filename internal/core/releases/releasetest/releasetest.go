// Package releasetest sets up a control plane's release repository in tests: offline keys made
// in memory, a root installed, builds uploaded over HTTP and published, as better-compute
// releases init and sign do.
package releasetest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// Repo is a repository and the offline keys that sign it.
type Repo struct {
	Env        *computetest.Env
	URL        string // the API's, for uploads
	RootKey    ed25519.PrivateKey
	TargetsKey ed25519.PrivateKey
}

// Init makes the offline keys and installs root 1 delegating to them and to env's online keys.
func Init(t testing.TB, env *computetest.Env, url string) *Repo {
	t.Helper()
	r := &Repo{Env: env, URL: url, RootKey: newKey(t), TargetsKey: newKey(t)}
	ctx := context.Background()
	keys, err := env.Compute.API.Releases.Keys(ctx, env.RootKey, api.GetReleaseKeys{})
	if err != nil {
		t.Fatalf("releasetest: %v", err)
	}
	root, err := tufrepo.SignRoot(1, r.Keys(t, keys), time.Now().Add(tufrepo.DefaultRootLifetime), r.RootKey)
	if err != nil {
		t.Fatalf("releasetest: %v", err)
	}
	if _, err := env.Compute.API.Releases.SetRoot(ctx, env.RootKey, api.SetReleaseRoot{Root: root}); err != nil {
		t.Fatalf("releasetest: set the root: %v", err)
	}
	return r
}

// Keys are the keys of r's root, with the online keys the control plane answered.
func (r *Repo) Keys(t testing.TB, online api.ReleaseKeys) tufrepo.RootKeys {
	t.Helper()
	s, err := tufrepo.ParsePublicKey(online.Snapshot.Public)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tufrepo.ParsePublicKey(online.Timestamp.Public)
	if err != nil {
		t.Fatal(err)
	}
	return tufrepo.RootKeys{Root: []ed25519.PublicKey{pub(r.RootKey)}, Targets: []ed25519.PublicKey{pub(r.TargetsKey)}, Snapshot: s, Timestamp: ts}
}

func newKey(t testing.TB) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// Upload uploads one build's bytes.
func (r *Repo) Upload(t testing.TB, b tufrepo.Build, data []byte) {
	t.Helper()
	sum := sha256.Sum256(data)
	tk, err := r.Env.Compute.API.Releases.Upload(context.Background(), r.Env.RootKey, api.UploadBuild{Version: b.Version, OS: b.OS, Arch: b.Arch,
		Length: int64(len(data)), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatalf("releasetest: releases.upload: %v", err)
	}
	if tk.Held {
		return
	}
	req, err := http.NewRequest(http.MethodPut, r.URL+tk.URL, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("releasetest: upload: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("releasetest: upload %s: %s", b.Version, res.Status)
	}
}

// Targets signs the successor of the repository's targets with builds added, expiring at exp.
func (r *Repo) Targets(t testing.TB, builds map[tufrepo.Build][]byte, key ed25519.PrivateKey, exp time.Time) []byte {
	t.Helper()
	var prev []byte
	if cur, err := r.Env.Compute.API.Releases.Metadata(context.Background(), r.Env.RootKey, api.GetReleaseMetadata{Role: api.RoleTargets}); err == nil {
		prev = cur.Metadata
	} else if api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("releasetest: %v", err)
	}
	var files []tufrepo.BuildFile
	for b, data := range builds {
		files = append(files, tufrepo.BuildFile{Build: b, Bytes: bytes.NewReader(data)})
	}
	signed, err := tufrepo.SignTargets(prev, files, key, exp)
	if err != nil {
		t.Fatalf("releasetest: %v", err)
	}
	return signed
}

// Publish uploads builds and publishes them, signed by the targets key.
func (r *Repo) Publish(t testing.TB, builds map[tufrepo.Build][]byte) api.Published {
	t.Helper()
	for b, data := range builds {
		r.Upload(t, b, data)
	}
	p, err := r.Env.Compute.API.Releases.Publish(context.Background(), r.Env.RootKey,
		api.PublishTargets{Targets: r.Targets(t, builds, r.TargetsKey, time.Now().Add(tufrepo.DefaultTargetsLifetime))})
	if err != nil {
		t.Fatalf("releasetest: releases.publish: %v", err)
	}
	return p
}
