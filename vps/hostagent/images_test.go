package hostagent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/runtime"
)

// recorder is a runtime that makes nothing: it keeps what the agent asked it to make, so that
// a test sees exactly what a hypervisor would have been given.
type recorder struct {
	mu   sync.Mutex
	made map[string]runtime.Instance
}

func (r *recorder) Name() string { return "recorder" }

func (r *recorder) List(context.Context) ([]runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runtime.Status
	for id := range r.made {
		out = append(out, runtime.Status{ID: id, State: runtime.StateRunning})
	}
	return out, nil
}

func (r *recorder) Ensure(_ context.Context, in runtime.Instance) (runtime.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.made[in.ID] = in
	return runtime.Status{ID: in.ID, State: runtime.StateRunning}, nil
}

func (r *recorder) Reboot(context.Context, string) error { return nil }

func (r *recorder) Delete(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.made, id)
	return nil
}

func (r *recorder) Save(context.Context, string, string) error {
	return errors.New("recorder: no saves")
}

func (r *recorder) Restore(context.Context, string, runtime.Instance) (runtime.Status, error) {
	return runtime.Status{}, errors.New("recorder: no restores")
}

func (r *recorder) instance(id string) (runtime.Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.made[id]
	return in, ok
}

// tb is what these helpers need of a test: a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

type discard struct{}

func (discard) Report(context.Context, string, any) error { return nil }

// imageServer serves files by path, as a tenant's image registry would, and counts the GETs.
type imageServer struct {
	*httptest.Server
	mu    sync.Mutex
	files map[string][]byte
	gets  map[string]int
}

func newImageServer(t *testing.T) *imageServer {
	s := &imageServer{files: map[string][]byte{}, gets: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, ok := s.files[r.URL.Path]
		s.gets[r.URL.Path]++
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

// serve serves b at path and returns it as an artifact.
func (s *imageServer) serve(path string, b []byte) hostapi.Artifact {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[path] = b
	sum := sha256.Sum256(b)
	return hostapi.Artifact{URL: s.URL + path, SHA256: hex.EncodeToString(sum[:])}
}

func (s *imageServer) fetched(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[path]
}

func newTestAgent(t tb, dir string) (*Agent, *recorder) {
	rec := &recorder{made: map[string]runtime.Instance{}}
	a, err := New(Options{Runtime: rec, Dir: dir, Reporter: discard{}})
	if err != nil {
		t.Fatal(err)
	}
	return a, rec
}

// converge applies instances as the node would, and returns the status the host then reports,
// by instance.
func converge(t tb, a *Agent, instances ...hostapi.Instance) map[string]hostapi.InstanceStatus {
	t.Helper()
	payload, err := json.Marshal(hostapi.Instances{Instances: instances})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.converge(context.Background(), hostapi.InstancesVersion, payload); err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]hostapi.InstanceStatus{}
	for _, s := range st.Instances {
		out[s.ID] = s
	}
	return out
}

func diskInstance(id, tenant string, disk hostapi.Artifact) hostapi.Instance {
	return hostapi.Instance{ID: id, Tenant: tenant, VCPUs: 1, MemoryMiB: 128, Disk: &disk, Power: runtime.PowerRunning}
}

// TestATenantBootsOnlyBytesItFetchedItself: the host's cache keeps images by checksum, but a
// checksum only names bytes; it does not prove the tenant may have them. Tenant B registering
// tenant A's checksum with a URL of its own (one that serves nothing, or other bytes) must not
// boot A's cached bytes; B boots them only once it has fetched them from its own URL and they
// matched, and then the cache serves B without fetching again. An instance whose control plane
// names no tenant fetches for itself.
func TestATenantBootsOnlyBytesItFetchedItself(t *testing.T) {
	t.Parallel()
	srv := newImageServer(t)
	a, rec := newTestAgent(t, t.TempDir())
	private := bytes.Repeat([]byte("tenant A's private disk "), 4096)
	artA := srv.serve("/a/disk.img", private)

	st := converge(t, a, diskInstance("a1", "tenant-a", artA))
	inA, ok := rec.instance("a1")
	if st["a1"].State != runtime.StateRunning || !ok || inA.Disk == "" {
		t.Fatalf("tenant A's instance: %+v; made: %v", st["a1"], ok)
	}

	// B names A's checksum with a URL that serves nothing, then with one that serves other bytes.
	srv.serve("/b/other.img", []byte("tenant B's own bytes"))
	for _, url := range []string{srv.URL + "/b/missing.img", srv.URL + "/b/other.img"} {
		b := diskInstance("b1", "tenant-b", hostapi.Artifact{URL: url, SHA256: artA.SHA256})
		st = converge(t, a, diskInstance("a1", "tenant-a", artA), b)
		if in, ok := rec.instance("b1"); ok {
			t.Fatalf("tenant B naming A's checksum at %s booted %s", url, in.Disk)
		}
		if st["b1"].State != runtime.StateError {
			t.Fatalf("tenant B's instance at %s: %+v; want it in error", url, st["b1"])
		}
	}

	// B fetching the same bytes from its own URL boots them, fetched once.
	artB := srv.serve("/b/copy.img", private)
	for range 2 {
		st = converge(t, a, diskInstance("a1", "tenant-a", artA), diskInstance("b1", "tenant-b", artB))
		if _, ok := rec.instance("b1"); !ok || st["b1"].State != runtime.StateRunning {
			t.Fatalf("tenant B's instance from its own copy: %+v", st["b1"])
		}
	}
	if n := srv.fetched("/b/copy.img"); n != 1 {
		t.Fatalf("tenant B's image was fetched %d times; want once", n)
	}
	if n := srv.fetched("/a/disk.img"); n != 1 {
		t.Fatalf("tenant A's image was fetched %d times; want once", n)
	}

	// Without a tenant, an instance fetches its images for itself.
	st = converge(t, a, diskInstance("a1", "tenant-a", artA), diskInstance("x1", "", hostapi.Artifact{URL: srv.URL + "/b/missing.img", SHA256: artA.SHA256}))
	if _, ok := rec.instance("x1"); ok || st["x1"].State != runtime.StateError {
		t.Fatalf("an instance without a tenant booted a cached image it did not fetch: %+v", st["x1"])
	}
}

// needQemuImg skips a test that needs qemu-img (Debian: qemu-utils, which .ci/run installs).
func needQemuImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skipf("needs qemu-img (apt-get install qemu-utils): %v", err)
	}
}

func qemuImg(t tb, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// secret is what the host's files hold in these tests: a guest that reads it has read a host
// file.
var secret = bytes.Repeat([]byte("HOST-SECRET!"), 1<<14) // 192 KiB, whole clusters of it

// hostFiles writes the files a crafted image may name: a raw file and a qcow2 image of the
// secret, beside the agent's directory and inside it (where a relative name from the cache
// reaches: another tenant's image, the agent's state).
func hostFiles(t tb, root string) {
	for _, dir := range []string{root, filepath.Join(root, "vps")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "shadow"), secret, 0o600); err != nil {
			t.Fatal(err)
		}
		qemuImg(t, "convert", "-q", "-f", "raw", "-O", "qcow2", filepath.Join(dir, "shadow"), filepath.Join(dir, "shadow.qcow2"))
	}
}

// crafted is an image a tenant made to read a host file, or an honest one.
type crafted struct {
	name   string
	honest bool // an image that names no other file, which the host must boot
	make   func(t tb, root, path string)
}

// craftedImages are the images of the review (issue 29, item 2) and their variants. root holds
// the host files (hostFiles); path is where the image is written, outside the agent's cache.
func craftedImages() []crafted {
	abs := func(root string) string { return filepath.Join(root, "shadow") }
	return []crafted{
		{"raw image", true, func(t tb, root, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte("honest raw disk "), 1<<14), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"flat qcow2", true, func(t tb, root, path string) {
			raw := path + ".src"
			if err := os.WriteFile(raw, bytes.Repeat([]byte("honest qcow2 disk "), 1<<14), 0o644); err != nil {
				t.Fatal(err)
			}
			qemuImg(t, "convert", "-q", "-f", "raw", "-O", "qcow2", raw, path)
		}},
		{"qcow2 backed by a raw host file", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root), "-F", "raw", path, "1M")
		}},
		{"qcow2 backed by a qcow2 host file", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root)+".qcow2", "-F", "qcow2", path, "1M")
		}},
		{"qcow2 backed by a host file, its format left to probing", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root), "-F", "raw", path, "1M")
			// qemu-img no longer writes such a header: the backing format's extension is made
			// the end of the extensions, as an older image has it.
			patch(t, path, []byte{0xe2, 0x79, 0x2a, 0xca}, []byte{0, 0, 0, 0})
		}},
		{"qcow2 backed by a name relative to the cache", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root), "-F", "raw", path, "1M")
			qemuImg(t, "rebase", "-u", "-f", "qcow2", "-b", "../shadow", "-F", "raw", path)
		}},
		{"qcow2 backed by a json: name", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root), "-F", "raw", path, "1M")
			qemuImg(t, "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", `json:{"driver":"raw","file":{"driver":"file","filename":"`+abs(root)+`"}}`, path)
		}},
		{"qcow2 with an external data file", false, func(t tb, root, path string) {
			// qemu-img makes the data file it names, so it names one beside the host's file,
			// renamed in the header to the host's (the tenant uploads the header alone).
			df := filepath.Join(root, "shadoX")
			qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+df+",data_file_raw=on", path, fmt.Sprint(len(secret)))
			patch(t, path, []byte(df), []byte(abs(root)))
		}},
		{"raw image that looks like a qcow2 with a backing file", false, func(t tb, root, path string) {
			qemuImg(t, "create", "-q", "-f", "qcow2", "-b", abs(root), "-F", "raw", path, "1M")
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(bytes.Repeat([]byte("raw data after a qcow2 header "), 1<<12)); err != nil {
				t.Fatal(err)
			}
		}},
		{"raw image that is a vmdk descriptor", true, func(t tb, root, path string) {
			desc := "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n" +
				"RW 384 FLAT \"" + abs(root) + "\" 0\n\nddb.virtualHWVersion = \"4\"\n"
			if err := os.WriteFile(path, []byte(desc), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// patch replaces the first old in the file at path by new, of the same length.
func patch(t tb, path string, old, new []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, old)
	if i < 0 || len(old) != len(new) {
		t.Fatalf("patch %s: %q is not in it", path, old)
	}
	copy(b[i:], new)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// guestReads is the whole disk an instance's guest would see: the runtimes' overlay on the
// image, made as they make it (qemu-img create -F with the format the host gave them), read
// back through QEMU's block layer. An image whose format was not given is probed, as the
// runtimes once did.
func guestReads(t tb, in runtime.Instance) []byte {
	t.Helper()
	dir, err := os.MkdirTemp("", "guest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	format := in.DiskFormat
	if format == "" {
		t.Errorf("the runtime was not told the format of %s", in.Disk)
		out, err := exec.Command("qemu-img", "info", "-U", "--output=json", in.Disk).Output()
		var info struct{ Format string }
		if err != nil || json.Unmarshal(out, &info) != nil {
			return nil
		}
		format = info.Format
	}
	overlay := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", format, "-b", in.Disk, overlay).CombinedOutput(); err != nil {
		t.Logf("no overlay on %s (%s): %v: %s", in.Disk, format, err, out)
		return nil
	}
	raw := filepath.Join(dir, "disk.raw")
	if out, err := exec.Command("qemu-img", "convert", "-U", "-f", "qcow2", "-O", "raw", overlay, raw).CombinedOutput(); err != nil {
		t.Logf("the overlay on %s does not read: %v: %s", in.Disk, err, out)
		return nil
	}
	b, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestImagesThatNameHostFilesAreRefused: an image is checked by its checksum, and then for what
// it would make the hypervisor open. A qcow2 with a backing file (raw, qcow2, its format left
// to probing, a name relative to the cache, a json: name) or an external data file is refused
// and never reaches the runtime; an honest raw or qcow2 image is booted, the runtime told its
// format (raw unless the image is a qcow2: a vmdk descriptor is raw bytes, not the file it
// names); and whatever is booted, the guest reads no host file through it.
func TestImagesThatNameHostFilesAreRefused(t *testing.T) {
	t.Parallel()
	needQemuImg(t)
	root := t.TempDir()
	hostFiles(t, root)
	srv := newImageServer(t)
	a, rec := newTestAgent(t, filepath.Join(root, "vps"))
	for i, c := range craftedImages() {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "image")
			c.make(t, root, path)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("i%d", i)
			st := converge(t, a, diskInstance(id, "tenant-a", srv.serve("/"+id, b)))[id]
			in, made := rec.instance(id)
			if made && bytes.Contains(guestReads(t, in), []byte("HOST-SECRET!")) {
				t.Fatalf("the guest of %s reads the host's file", c.name)
			}
			switch {
			case c.honest && (!made || st.State != runtime.StateRunning):
				t.Fatalf("an honest %s was not booted: %+v", c.name, st)
			case c.honest && in.DiskFormat != map[bool]string{true: runtime.FormatQcow2, false: runtime.FormatRaw}[bytes.HasPrefix(b, []byte("QFI\xfb"))]:
				t.Fatalf("%s was given as %q", c.name, in.DiskFormat)
			case !c.honest && made:
				t.Fatalf("%s reached the runtime as %+v", c.name, in)
			case !c.honest && (st.State != runtime.StateError || !strings.Contains(st.Detail, "names")):
				t.Fatalf("%s: %+v; want it in error, saying what the image names", c.name, st)
			}
		})
	}
}

// TestNoImageLetsAGuestReadAHostFile: the property behind the cases above, over images made of
// random parts: a qcow2 header (flat, or naming a host file by backing file or data file,
// absolute or relative, with its format or without), random bytes after it or instead of it.
// Whatever the host boots, its guest never reads the host's file.
func TestNoImageLetsAGuestReadAHostFile(t *testing.T) {
	t.Parallel()
	needQemuImg(t)
	root := t.TempDir()
	hostFiles(t, root)
	srv := newImageServer(t)
	a, rec := newTestAgent(t, filepath.Join(root, "vps"))
	kinds := craftedImages()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		id := fmt.Sprintf("p%d", n)
		dir, err := os.MkdirTemp(root, "image-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		path := filepath.Join(dir, "image")
		c := rapid.SampledFrom(kinds).Draw(rt, "kind")
		c.make(rt, root, path)
		b, err := os.ReadFile(path)
		if err != nil {
			rt.Fatal(err)
		}
		// Random bytes over part of it: a header field changed, or the tail.
		if rapid.Bool().Draw(rt, "mutate") {
			at := rapid.IntRange(0, len(b)-1).Draw(rt, "at")
			patch := rapid.SliceOfN(rapid.Byte(), 1, 16).Draw(rt, "patch")
			b = append(b[:at:at], append(patch, b[min(len(b), at+len(patch)):]...)...)
		}
		converge(rt, a, diskInstance(id, "tenant-a", srv.serve("/"+id, b)))
		if in, made := rec.instance(id); made && bytes.Contains(guestReads(rt, in), []byte("HOST-SECRET!")) {
			rt.Fatalf("the guest of a %s reads the host's file", c.name)
		}
	})
}

// TestCachedBytesGoOnlyToTenantsThatFetchedThem: the property behind
// TestATenantBootsOnlyBytesItFetchedItself, over random histories: tenants (and instances
// without one) name random checksums at URLs of their own that serve one of a few images, or
// nothing, changing between steps. An instance is made exactly when its tenant has fetched
// bytes of that checksum from its own URL (now, or before: then the host fetches nothing), and
// what it is given holds those bytes.
func TestCachedBytesGoOnlyToTenantsThatFetchedThem(t *testing.T) {
	t.Parallel()
	srv := newImageServer(t)
	blobs := [][]byte{[]byte("image zero"), []byte("image one"), []byte("image two")}
	sums := make([]string, len(blobs))
	for i, b := range blobs {
		s := sha256.Sum256(b)
		sums[i] = hex.EncodeToString(s[:])
	}
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		dir, err := os.MkdirTemp("", "cache-")
		if err != nil {
			rt.Fatal(err)
		}
		defer os.RemoveAll(dir)
		a, rec := newTestAgent(rt, dir)
		n++
		fetched := map[string]map[string]bool{} // tenant → checksums it fetched
		steps := rapid.IntRange(1, 12).Draw(rt, "steps")
		for step := range steps {
			tenant := rapid.SampledFrom([]string{"a", "b", "c", ""}).Draw(rt, "tenant")
			want := rapid.IntRange(0, len(blobs)-1).Draw(rt, "names")
			serves := rapid.IntRange(-1, len(blobs)-1).Draw(rt, "serves") // -1: nothing
			path := fmt.Sprintf("/%d/%s/disk", n, tenant)
			srv.mu.Lock()
			if serves < 0 {
				delete(srv.files, path)
			} else {
				srv.files[path] = blobs[serves]
			}
			before := srv.gets[path]
			srv.mu.Unlock()
			id := fmt.Sprintf("i%d", step)
			converge(rt, a, diskInstance(id, tenant, hostapi.Artifact{URL: srv.URL + path, SHA256: sums[want]}))
			had := tenant != "" && fetched[tenant][sums[want]]
			ok := had || serves == want
			if ok && tenant != "" {
				if fetched[tenant] == nil {
					fetched[tenant] = map[string]bool{}
				}
				fetched[tenant][sums[want]] = true
			}
			in, made := rec.instance(id)
			switch {
			case made != ok:
				rt.Fatalf("tenant %q naming image %d at a URL serving %d (fetched before: %v): made %v", tenant, want, serves, had, made)
			case had && srv.fetched(path) != before:
				rt.Fatalf("tenant %q fetched image %d again", tenant, want)
			case made:
				if b, err := os.ReadFile(in.Disk); err != nil || !bytes.Equal(b, blobs[want]) {
					rt.Fatalf("tenant %q was given %q for image %d (%v)", tenant, b, want, err)
				}
			}
		}
	})
}

// TestAnImageLargerThanTheHostTakesIsRefused: a tenant's URL could serve bytes without end and
// fill the host's disk before its checksum is known: a fetch stops past MaxImageBytes, keeps
// nothing, and says why; an image of the limit is kept.
func TestAnImageLargerThanTheHostTakesIsRefused(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte("i"), 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/endless" {
			for range 100 {
				if _, err := w.Write(body); err != nil {
					return
				}
			}
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	dir := t.TempDir()
	c := &cache{dir: dir, http: srv.Client(), maxBytes: int64(len(body))}
	sum := sha256.Sum256(body)
	if _, err := c.fetch(context.Background(), hostapi.Artifact{URL: srv.URL + "/endless", SHA256: hex.EncodeToString(sum[:])}); err == nil ||
		!strings.Contains(err.Error(), "larger than") {
		t.Fatalf("an endless image: %v, want it refused as larger than the host takes", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("a refused fetch left %d files", len(left))
	}
	p, err := c.fetch(context.Background(), hostapi.Artifact{URL: srv.URL + "/exact", SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatalf("an image of the limit: %v", err)
	}
	os.Remove(p)
}
