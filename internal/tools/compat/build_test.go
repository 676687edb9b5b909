package compat

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// release is an earlier build of this repository. Until releases are tagged, the builds the
// matrix runs are the commits at which the node protocol changed (git log -- agent/v1): each is
// the newest build of its protocol.
type release struct {
	name   string // N-1 is the protocol before this tree's
	commit string
	// what this tree has that the release does not
	lacks string
	// refusal, for a release outside the supported window, is how the break shows: the error
	// the node acknowledges a reservation's desired state with. The matrix checks that it still
	// shows so, and that the rest works.
	refusal string
}

// releases, newest first. Add the commit of each change to agent/v1.proto at the top, and keep
// at least the two before it; an entry may go once nothing runs it any more
// (docs/compatibility.md, "Which versions").
var releases = []release{
	{"N-1", "018948e9571aebeefff2b30af30253445a1cce16", "a tunnel's reservation and root (TunnelOpen.reservation, .root: holders confined to their own users)", ""},
	{"N-2", "826c252dab675e69e348799451fabfa31e5c552e", "TPM evidence in joins (JoinRequest.tpm, JoinResponse.tpm_challenge), tunnels' confinement", ""},
	// Outside the window, and still working.
	{"N-3", "424a22ed658825f1f3939697f717d29e064bf431", "the node's TunnelAck (input credit), TPM evidence, tunnels' confinement", ""},
	// Outside the window, and still working: it knows optional desired-state parts.
	{"N-4", "a2754151c8170e48b414d3405e51732b348cbfb6", "tunnels (TunnelOpen/Input/Ack/Output/Exit), TPM evidence", ""},
	// Outside the window: it knows no optional desired-state part, and refuses the state of
	// every node a reservation holds, which carries the optional access.ssh part. Its devices
	// converge (the CDI spec is written before the parts) and its commands run.
	{"N-5", "dbad76c3b4e009ad2d14497a3fcc7393ae16c173", "optional desired-state parts (DesiredPart.optional), SSH access, tunnels, TPM evidence",
		`no extension of this node converges desired-state kind "access.ssh"`},
}

// repoRoot is the root of the git checkout this package is in.
func repoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): the skew tests build older commits of it", err)
	}
	return strings.TrimSpace(string(out))
}

var buildMu sync.Mutex // one build at a time: they share the Go build cache and two cores

// buildAt builds pkg (./bcd, ./cmd/better-compute) as it was at commit and returns the binary.
// The commit's tree comes from git archive (no worktree is added to the repository); binaries
// are kept under the user's cache directory by commit, so a second run does not build again.
// A checkout without the commit (a shallow clone) skips the test, saying so.
func buildAt(t testing.TB, commit, pkg string) string {
	t.Helper()
	root := repoRoot(t)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this checkout (a shallow clone?): git fetch --unshallow to run the skew tests", commit[:12])
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "better-compute", "compat")
	bin := filepath.Join(dir, commit[:12]+"-"+filepath.Base(pkg))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	var stderr bytes.Buffer
	archive.Stderr, untar.Stderr = &stderr, &stderr
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v\n%s", commit, err, stderr.String())
	}
	tmp := bin + ".tmp" + filepath.Base(src)
	build := exec.Command("go", "build", "-o", tmp, pkg)
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s at %s: %v\n%s", pkg, commit[:12], err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s at %s in %s", pkg, commit[:12], time.Since(start).Round(100*time.Millisecond))
	return bin
}

// buildHere builds pkg from this tree, once per test.
func buildHere(t testing.TB, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}
