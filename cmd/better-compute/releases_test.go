package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/releases/releasetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// TestReleasesInitSignPush makes the offline keys and a root with better-compute releases init,
// publishes a build with releases sign, then signs one offline (sign --out, from a copy of the
// current targets) and publishes it from elsewhere with releases push.
func TestReleasesInitSignPush(t *testing.T) {
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{})
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	t.Setenv("BETTER_COMPUTE_URL", env.Server(t))
	t.Setenv("BETTER_COMPUTE_API_KEY", env.RootKey)
	cli := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	keys := filepath.Join(t.TempDir(), "keys")
	if code, out, errs := cli("releases", "init", "--keys", keys); code != 0 || !strings.Contains(out, "root 1 installed") {
		t.Fatalf("init = %d %s %s", code, out, errs)
	}
	for _, f := range []string{"root.key", "targets.key"} {
		st, err := os.Stat(filepath.Join(keys, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, st, err)
		}
	}
	rootKey, _ := os.ReadFile(filepath.Join(keys, "root.key"))
	// Again: the same keys, root 2.
	if code, out, errs := cli("releases", "init", "--keys", keys); code != 0 || !strings.Contains(out, "root 2 installed") {
		t.Fatalf("init again = %d %s %s", code, out, errs)
	}
	if again, _ := os.ReadFile(filepath.Join(keys, "root.key")); !bytes.Equal(again, rootKey) {
		t.Fatal("a second init replaced the root key")
	}

	build := filepath.Join(t.TempDir(), "bcd")
	if err := os.WriteFile(build, []byte("#!/bin/sh\necho v1.0.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := cli("releases", "sign", "--keys", keys, "--version", "v1.0.0", "--file", "linux/amd64="+build); code != 0 ||
		!strings.Contains(out, "published targets 1") || !strings.Contains(out, "release v1.0.0") {
		t.Fatalf("sign = %d %s %s", code, out, errs)
	}

	// Offline: the current targets carried to the signer, signed there, pushed from here.
	cur, err := env.Compute.API.Releases.Metadata(ctx, env.RootKey, api.GetReleaseMetadata{Role: api.RoleTargets})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	current, signed := filepath.Join(dir, "targets.json"), filepath.Join(dir, "signed.json")
	if err := os.WriteFile(current, cur.Metadata, 0o644); err != nil {
		t.Fatal(err)
	}
	build2 := filepath.Join(dir, "bcd-arm")
	if err := os.WriteFile(build2, []byte("#!/bin/sh\necho v1.1.0 arm\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BETTER_COMPUTE_URL", "") // the signer reaches no control plane
	if code, out, errs := cli("releases", "sign", "--keys", keys, "--version", "v1.1.0", "--file", "linux/arm64="+build2, "--current", current, "--out", signed); code != 0 {
		t.Fatalf("sign --out = %d %s %s", code, out, errs)
	}
	t.Setenv("BETTER_COMPUTE_URL", env.Server(t))
	if code, _, errs := cli("releases", "push", "--signed", signed, "--file", "linux/amd64="+build2); code == 0 || !strings.Contains(errs, "not a build the signed targets list") {
		t.Fatalf("push of a build the targets do not list = %d %s", code, errs)
	}
	if code, out, errs := cli("releases", "push", "--signed", signed, "--file", "linux/arm64="+build2); code != 0 || !strings.Contains(out, "release v1.1.0") {
		t.Fatalf("push = %d %s %s", code, out, errs)
	}
	page, err := env.Compute.API.Releases.List(ctx, env.RootKey, api.ListReleases{})
	if err != nil || len(page.Items) != 2 || page.Items[0].Version != "v1.1.0" || page.Items[0].Builds[0].Arch != "arm64" {
		t.Fatalf("releases = %+v, %v", page, err)
	}
	if code, _, errs := cli("releases", "sign", "--keys", keys, "--version", "v2", "--file", "linux-amd64"); code != 2 || !strings.Contains(errs, "os/arch=PATH") {
		t.Fatalf("a malformed --file = %d %s", code, errs)
	}
}

// TestRolloutsWatch follows a rollout whose only node never comes back on the release: a line
// per change, and exit 1 with the error once the failed wave pauses it.
func TestRolloutsWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	releasetest.Init(t, env, url).Publish(t, map[tufrepo.Build][]byte{{Version: "v2.0.0", OS: "linux", Arch: "amd64"}: []byte("bcd v2")})
	p, err := env.Compute.API.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: p.ID, Name: "n0"}); err != nil {
		t.Fatal(err)
	}
	if err := env.Compute.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := env.Compute.API.Rollouts.Create(ctx, env.RootKey, api.CreateRollout{Pool: "p1", Release: "v2.0.0", WaveDeadline: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr computetest.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(append(connection(t, url, env.RootKey), "rollouts", "watch", r.ID, "--every", "100ms"), &stdout, &stderr)
	}()
	computetest.Eventually(t, 30*time.Second, "the watch showing wave 1 running", func() bool {
		return stdout.Contains("wave 1 running: wave 1: waiting for n0")
	})
	// The wave's deadline passes on the database's clock, which the test moves past it.
	env.DB.SetNow(time.Now().Add(time.Minute))
	var code int
	select {
	case code = <-exit:
	case <-time.After(60 * time.Second):
		t.Fatalf("the watch did not end once the wave's deadline passed:\n%s\n%s", stdout.String(), stderr.String())
	}
	if code != 1 || !strings.Contains(stderr.String(), "paused: wave 1 failed: n0 did not come back online on v2.0.0") {
		t.Fatalf("watch = %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"[-] 0/1 on v2.0.0, wave 1 running: wave 1: waiting for n0", "[-] 0/1 on v2.0.0, wave 1 paused: wave 1 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("the progress lacks %q:\n%s", want, out)
		}
	}
}
