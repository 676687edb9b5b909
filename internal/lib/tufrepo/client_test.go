package tufrepo

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"
)

// testRepo is a repository as the control plane keeps one, with all four keys in hand, served
// over HTTP; tests tamper with what it serves.
type testRepo struct {
	t                                   *testing.T
	rootKey, targetsKey, snapKey, tsKey ed25519.PrivateKey
	targets                             *metadata.Metadata[metadata.TargetsType]
	rootV, snapV, tsV                   int64
	mu                                  sync.Mutex
	files                               map[string][]byte // path under NodePath
}

func newKey(t *testing.T) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pub(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

func newTestRepo(t *testing.T) *testRepo {
	r := &testRepo{t: t, rootKey: newKey(t), targetsKey: newKey(t), snapKey: newKey(t), tsKey: newKey(t), files: map[string][]byte{}}
	root, err := NewRoot(1, RootKeys{Root: []ed25519.PublicKey{pub(r.rootKey)}, Targets: []ed25519.PublicKey{pub(r.targetsKey)},
		Snapshot: pub(r.snapKey), Timestamp: pub(r.tsKey)}, time.Now().Add(DefaultRootLifetime))
	if err != nil {
		t.Fatal(err)
	}
	if err := Sign(root, r.rootKey); err != nil {
		t.Fatal(err)
	}
	r.rootV = 1
	r.put("metadata/1.root.json", mustBytes(t, root))
	return r
}

func mustBytes[T metadata.Roles](t *testing.T, md *metadata.Metadata[T]) []byte {
	t.Helper()
	b, err := md.ToBytes(false)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r *testRepo) put(path string, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.files[path] = b
}

func (r *testRepo) snapshot() map[string][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.files)
}

func (r *testRepo) restore(files map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.files = files
}

// publish lists b (data) in the next targets, signed by signer, expiring at exp, with a new
// snapshot and timestamp.
func (r *testRepo) publish(b Build, data []byte, signer ed25519.PrivateKey, exp time.Time) {
	t := r.t
	t.Helper()
	next := NextTargets(r.targets, exp)
	if r.targets == nil {
		next.Signed.Version = 1
	}
	tf, err := AddBuild(next, b, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := Sign(next, signer); err != nil {
		t.Fatal(err)
	}
	r.targets = next
	r.put("metadata/"+itoa(next.Signed.Version)+".targets.json", mustBytes(t, next))
	sum, _ := SHA256(tf)
	r.put("targets/"+sum+"."+tf.Path, data)
	r.resign(exp)
}

func (r *testRepo) resign(exp time.Time) {
	t := r.t
	r.snapV++
	snap, err := NewSnapshot(r.snapV, r.targets.Signed.Version, exp, r.snapKey)
	if err != nil {
		t.Fatal(err)
	}
	r.put("metadata/"+itoa(r.snapV)+".snapshot.json", snap)
	r.tsV++
	ts, err := NewTimestamp(r.tsV, snap, r.snapV, exp, r.tsKey)
	if err != nil {
		t.Fatal(err)
	}
	r.put("metadata/timestamp.json", ts)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (r *testRepo) serve(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		path, ok := strings.CutPrefix(req.URL.Path, NodePath)
		r.mu.Lock()
		b, found := r.files[path]
		r.mu.Unlock()
		if !ok || !found {
			http.NotFound(w, req)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

func client(t *testing.T, s *httptest.Server) *Client {
	return &Client{BaseURL: s.URL, HTTP: s.Client(), Dir: t.TempDir()}
}

var v1 = Build{Version: "v1.0.0", OS: "linux", Arch: "amd64"}

func TestFetchVerifiesABuild(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	c := client(t, r.serve(t))
	dst := filepath.Join(t.TempDir(), "bcd")
	if _, err := c.Fetch(context.Background(), v1, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "bcd v1.0.0" {
		t.Fatalf("fetched %q", b)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm()&0o100 == 0 {
		t.Fatalf("the build is not executable: %v", st.Mode())
	}
	// A build the targets do not list.
	if _, err := c.Fetch(context.Background(), Build{Version: "v9", OS: "linux", Arch: "amd64"}, dst+"9"); err == nil {
		t.Fatal("fetched a build the repository does not list")
	}
}

// refused fetches v1 and wants an error containing want, and nothing at the destination.
func refused(t *testing.T, c *Client, b Build, want string) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "bcd")
	_, err := c.Fetch(context.Background(), b, dst)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("fetch = %v, want an error containing %q", err, want)
	}
	if _, serr := os.Stat(dst); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("a refused build was written: %v", serr)
	}
}

func TestTamperedTargetIsRefused(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	for path := range r.snapshot() {
		if strings.HasPrefix(path, "targets/") {
			r.put(path, []byte("bcd v1.0.X")) // same length, other bytes
		}
	}
	refused(t, client(t, r.serve(t)), v1, "does not verify")
}

func TestTamperedMetadataIsRefused(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	// Someone who can write the server's metadata but holds no targets key points the build at
	// bytes of their own: the signature no longer covers what the metadata says.
	evil := []byte("evil build")
	sum := sha256.Sum256(evil)
	path := "metadata/1.targets.json"
	b := r.snapshot()[path]
	md, err := metadata.Targets().FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	name := TargetName(v1.Version, v1.OS, v1.Arch)
	md.Signed.Targets[name].Hashes["sha256"] = sum[:]
	md.Signed.Targets[name].Length = int64(len(evil))
	r.put(path, mustBytes(t, md))
	r.put("targets/"+hex.EncodeToString(sum[:])+"."+name, evil)
	refused(t, client(t, r.serve(t)), v1, "does not verify")
}

func TestTargetsSignedByAnOnlineKeyAreRefused(t *testing.T) {
	t.Parallel()
	// A control plane holds the snapshot and timestamp keys only: whatever it signs as targets
	// is not a release.
	r := newTestRepo(t)
	r.publish(v1, []byte("bcd v1.0.0"), r.snapKey, time.Now().Add(time.Hour))
	refused(t, client(t, r.serve(t)), v1, "does not verify")
}

func TestExpiredMetadataIsRefused(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(-time.Minute))
	refused(t, client(t, r.serve(t)), v1, "expired")
}

func TestRolledBackMetadataIsRefused(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	s := r.serve(t)
	c := client(t, s)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	old := r.snapshot()
	v2 := Build{Version: "v2.0.0", OS: "linux", Arch: "amd64"}
	r.publish(v2, []byte("bcd v2.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	if _, err := c.Fetch(context.Background(), v2, filepath.Join(t.TempDir(), "bcd")); err != nil {
		t.Fatal(err)
	}
	// The server goes back to the metadata of before v2: validly signed, but older than what the
	// node has seen.
	r.restore(old)
	refused(t, c, v1, "does not verify")
	if _, err := os.Stat(filepath.Join(c.Dir, "timestamp.json")); err != nil {
		t.Fatalf("the client keeps no timestamp: %v", err)
	}
}

func TestRootRotation(t *testing.T) {
	t.Parallel()
	r := newTestRepo(t)
	s := r.serve(t)
	c := client(t, s)
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	if _, err := c.Fetch(context.Background(), v1, filepath.Join(t.TempDir(), "bcd")); err != nil {
		t.Fatal(err)
	}
	// Root 2 replaces the root and targets keys; signed by the new root key alone, a node that
	// trusts root 1 refuses it.
	newRoot, newTargets := newKey(t), newKey(t)
	root2, err := NewRoot(2, RootKeys{Root: []ed25519.PublicKey{pub(newRoot)}, Targets: []ed25519.PublicKey{pub(newTargets)},
		Snapshot: pub(r.snapKey), Timestamp: pub(r.tsKey)}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := Sign(root2, newRoot); err != nil {
		t.Fatal(err)
	}
	r.put("metadata/2.root.json", mustBytes(t, root2))
	r.targets = nil
	r.publish(v1, []byte("bcd v1.0.0"), newTargets, time.Now().Add(time.Hour))
	refused(t, c, v1, "does not verify")
	// Signed by the old root key too, it is followed, and builds signed by the new targets key
	// verify.
	if err := Sign(root2, r.rootKey); err != nil {
		t.Fatal(err)
	}
	r.put("metadata/2.root.json", mustBytes(t, root2))
	c2 := client(t, s) // a node that saw none of the above
	for _, cl := range []*Client{c, c2} {
		if _, err := cl.Fetch(context.Background(), v1, filepath.Join(t.TempDir(), "bcd")); err != nil {
			t.Fatal(err)
		}
	}
	// Targets signed by the replaced targets key no longer verify under root 2.
	r.publish(v1, []byte("bcd v1.0.0"), r.targetsKey, time.Now().Add(time.Hour))
	refused(t, c2, v1, "does not verify")
}

func TestPinnedRootRefusesAnotherRepository(t *testing.T) {
	t.Parallel()
	a, b := newTestRepo(t), newTestRepo(t)
	b.publish(v1, []byte("bcd v1.0.0"), b.targetsKey, time.Now().Add(time.Hour))
	c := client(t, b.serve(t))
	c.Root = a.snapshot()["metadata/1.root.json"]
	refused(t, c, v1, "does not verify")
}
