package site

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/metal/siteapi"
)

// imageServer is where the plan's images come from: an httptest server whose answers a test
// scripts, counting the requests of each path.
type imageServer struct {
	*httptest.Server
	mu       sync.Mutex
	files    map[string][]byte // path → bytes
	lie      map[string]int64  // path → Content-Length to claim instead
	fail     map[string]int    // path → 500s before it serves
	auth     map[string]string // path → the Authorization it needs
	hits     map[string]int
	inFlight atomic.Int32
	maxIn    atomic.Int32
	delay    time.Duration
}

func newImageServer(t *testing.T) *imageServer {
	is := &imageServer{files: map[string][]byte{}, lie: map[string]int64{}, fail: map[string]int{}, auth: map[string]string{}, hits: map[string]int{}}
	is.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := is.inFlight.Add(1)
		defer is.inFlight.Add(-1)
		for m := is.maxIn.Load(); n > m && !is.maxIn.CompareAndSwap(m, n); m = is.maxIn.Load() {
		}
		is.mu.Lock()
		is.hits[r.URL.Path]++
		b, ok := is.files[r.URL.Path]
		lie, lies := is.lie[r.URL.Path]
		fail := is.fail[r.URL.Path] > 0
		if fail {
			is.fail[r.URL.Path]--
		}
		delay := is.delay
		auth, private := is.auth[r.URL.Path]
		is.mu.Unlock()
		time.Sleep(delay) // a slow registry, when a test wants downloads to overlap: the behaviour tested
		switch {
		case !ok:
			http.NotFound(w, r)
		case private && r.Header.Get("Authorization") != auth:
			http.Error(w, "who are you", http.StatusUnauthorized)
		case fail:
			http.Error(w, "try later", http.StatusInternalServerError)
		case lies:
			w.Header().Set("Content-Length", strconv.FormatInt(lie, 10))
			w.Write(b[:min(int64(len(b)), lie)])
		default:
			w.Write(b)
		}
	}))
	t.Cleanup(is.Close)
	return is
}

func (is *imageServer) hitsOf(path string) int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.hits[path]
}

// image puts content at path and returns the plan's image of it (sha and size of want, which
// differ from content for a corrupt image).
func (is *imageServer) image(path string, content, want []byte) siteapi.Image {
	is.mu.Lock()
	is.files[path] = content
	is.mu.Unlock()
	sum := sha256.Sum256(want)
	return siteapi.Image{ID: strings.TrimPrefix(path, "/"), URL: is.URL + path, Format: "raw", SizeBytes: int64(len(want)), SHA256: hex.EncodeToString(sum[:])}
}

func planWith(images ...siteapi.Image) siteapi.Plan {
	p := testPlan(siteapi.UnknownInspect)
	p.Images = images
	return p
}

// imageToken makes p the plan, with machine m-ramdisk deploying im, and returns the token of a
// boot of m-ramdisk: what a ramdisk asks for im with.
func (ts *testSite) imageToken(t *testing.T, p siteapi.Plan, im siteapi.Image) string {
	t.Helper()
	p.Machines[0].Task = &siteapi.Task{ID: "deploy-" + im.ID, Kind: siteapi.TaskDeploy, Image: &im, Then: siteapi.ThenWait}
	must(t, ts.SetPlan(p))
	return ts.bootToken(t, macRamdisk)
}

func imageStates(got []sent) []siteapi.ImageState {
	return ofKind[siteapi.ImageState](got, siteapi.KindImageCached)
}

// waitImage waits for a report of the image and returns the last one.
func waitImage(t *testing.T, up *recorder, sha, state string) siteapi.ImageState {
	t.Helper()
	var last siteapi.ImageState
	up.waitFor(t, "image "+sha[:8]+" "+state, func(s []sent) bool {
		for _, st := range imageStates(s) {
			if st.SHA256 == sha && st.State == state {
				last = st
				return true
			}
		}
		return false
	})
	return last
}

func cacheFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestImageCached: a good image is downloaded, verified, reported cached and served (whole, by
// range, conditionally); an image the plan does not name is not served.
func TestImageCached(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	content := bytes.Repeat([]byte("a disk image "), 10000)
	im := is.image("/good.raw", content, content)
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))

	if status, _, _ := ts.do(t, "GET", "/images/"+im.SHA256, "", ""); status != http.StatusUnauthorized {
		t.Errorf("before any plan, without a boot: %d, want 401", status)
	}
	token := ts.imageToken(t, planWith(im), im)
	waitImage(t, ts.up, im.SHA256, siteapi.ImageCached)

	status, body, h := ts.do(t, "GET", "/images/"+im.SHA256, token, "")
	if status != http.StatusOK || body != string(content) {
		t.Fatalf("GET the image: %d, %d bytes; want 200, %d", status, len(body), len(content))
	}
	if h.Get("ETag") != `"`+im.SHA256+`"` {
		t.Errorf("ETag %q", h.Get("ETag"))
	}
	req, _ := http.NewRequest("GET", ts.base+"/images/"+im.SHA256, nil)
	req.Header.Set("Range", "bytes=100-199")
	req.Header.Set("Authorization", "Bearer "+token)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	must(t, err)
	part, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(part, content[100:200]) {
		t.Errorf("range: %d, %d bytes; want 206 and bytes 100-199", resp.StatusCode, len(part))
	}
	other := sha256.Sum256([]byte("other"))
	for _, path := range []string{"/images/" + hex.EncodeToString(other[:]), "/images/not-a-sha", "/images/" + im.SHA256 + "/x"} {
		if status, _, _ := ts.do(t, "GET", path, token, ""); status != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, status)
		}
	}
	if got := cacheFiles(t, ts.cfg.CacheDir); !slices.Equal(got, []string{im.SHA256}) {
		t.Errorf("cache directory holds %v, want only %s", got, im.SHA256)
	}
}

// TestImagePullToken: a private image is fetched with the plan's Authorization, and served to
// ramdisks without it; the same image without its token is refused by its registry.
func TestImagePullToken(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	content := bytes.Repeat([]byte("private "), 1000)
	im := is.image("/private.raw", content, content)
	is.mu.Lock()
	is.auth["/private.raw"] = "Bearer pull-token"
	is.mu.Unlock()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(planWith(im)))
	if st := waitImage(t, ts.up, im.SHA256, siteapi.ImageFailed); !strings.Contains(st.Error, "401") {
		t.Fatalf("without its token: %+v, want the registry's 401", st)
	}
	im.Authorization = "Bearer pull-token"
	token := ts.imageToken(t, planWith(im), im)
	waitImage(t, ts.up, im.SHA256, siteapi.ImageCached)
	if status, body, _ := ts.do(t, "GET", "/images/"+im.SHA256, token, ""); status != http.StatusOK || body != string(content) {
		t.Fatalf("GET the private image: %d, %d bytes", status, len(body))
	}
}

// TestImageRefused: bytes whose SHA-256 or size is not the plan's are reported failed, with the
// reason, never served, and leave nothing in the cache; a transient 500 is retried.
func TestImageRefused(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	good := bytes.Repeat([]byte("good "), 1000)
	corrupt := is.image("/corrupt.raw", append(bytes.Clone(good[:len(good)-1]), 'X'), good)
	short := is.image("/short.raw", good[:100], good[:101])         // no Content-Length lie: fewer bytes
	long := is.image("/long.raw", append(good, good...), good[:50]) // more bytes than the plan says
	liar := is.image("/liar.raw", good[1:], good[1:])
	is.lie["/liar.raw"] = int64(len(good) - 10) // claims and sends fewer
	missing := siteapi.Image{ID: "missing", URL: is.URL + "/missing.raw", Format: "raw", SizeBytes: 3, SHA256: strings.Repeat("ab", 32)}
	flaky := is.image("/flaky.raw", bytes.Repeat([]byte("z"), 4096), bytes.Repeat([]byte("z"), 4096))
	is.fail["/flaky.raw"] = 2

	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.FetchConcurrency = 6
	ts := startSite(t, cfg)
	must(t, ts.SetPlan(planWith(corrupt, short, long, liar, missing, flaky)))
	for _, c := range []struct {
		im   siteapi.Image
		says string
	}{
		{corrupt, "sha256:"},
		{short, "size:"},
		{long, "size:"},
		{liar, "size:"},
		{missing, "404 Not Found"},
		{flaky, "500 Internal Server Error"},
	} {
		st := waitImage(t, ts.up, c.im.SHA256, siteapi.ImageFailed)
		if !strings.Contains(st.Error, c.says) {
			t.Errorf("%s: failed with %q, want it to say %q", c.im.ID, st.Error, c.says)
		}
		if c.im.ID != "flaky.raw" {
			token := ts.imageToken(t, planWith(corrupt, short, long, liar, missing, flaky), c.im)
			if status, _, _ := ts.do(t, "GET", "/images/"+c.im.SHA256, token, ""); status != http.StatusNotFound {
				t.Errorf("%s: served (%d) though it failed", c.im.ID, status)
			}
		}
	}
	waitImage(t, ts.up, flaky.SHA256, siteapi.ImageCached)
	if hits := is.hitsOf("/flaky.raw"); hits != 3 {
		t.Errorf("flaky image fetched %d times, want 3 (two 500s, then the bytes)", hits)
	}
	if hits := is.hitsOf("/corrupt.raw"); hits < 2 {
		t.Errorf("corrupt image fetched %d times, want retries", hits)
	}
	must(t, ts.SetPlan(planWith(flaky))) // stop the retries, then look at the directory
	computetest.Eventually(t, 5*time.Second, "the cache directory to hold only the flaky image, and no temporary file", func() bool {
		return slices.Equal(cacheFiles(t, ts.cfg.CacheDir), []string{flaky.SHA256})
	})
}

// TestImageRemovedAndRestart: an image that leaves the plan is removed and no longer served; a
// site restarted on the same cache verifies what it finds and reports it cached without
// fetching it again, fetches again a cached file that no longer verifies, and removes files no
// plan names.
func TestImageRemovedAndRestart(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	a := is.image("/a.raw", bytes.Repeat([]byte("a"), 5000), bytes.Repeat([]byte("a"), 5000))
	b := is.image("/b.raw", bytes.Repeat([]byte("b"), 5000), bytes.Repeat([]byte("b"), 5000))
	c := is.image("/c.raw", bytes.Repeat([]byte("c"), 5000), bytes.Repeat([]byte("c"), 5000))
	dir := t.TempDir()
	cfg := fixture(t, dir, newRecorder())

	first := startSite(t, cfg)
	must(t, first.SetPlan(planWith(a, b, c)))
	for _, im := range []siteapi.Image{a, b, c} {
		waitImage(t, first.up, im.SHA256, siteapi.ImageCached)
	}
	must(t, first.SetPlan(planWith(a, b)))
	computetest.Eventually(t, 5*time.Second, "the image that left the plan to leave the cache", func() bool {
		return !slices.Contains(cacheFiles(t, cfg.CacheDir), c.SHA256)
	})
	if status, _, _ := first.do(t, "GET", "/images/"+c.SHA256, first.imageToken(t, planWith(a, b), c), ""); status != http.StatusNotFound {
		t.Errorf("an image that left the plan is served: %d", status)
	}
	must(t, first.stop())

	// Between runs: b's file is damaged, and a stray image and a temporary file appear.
	must(t, os.WriteFile(filepath.Join(cfg.CacheDir, b.SHA256), bytes.Repeat([]byte("B"), 5000), 0o644))
	stray := strings.Repeat("0", 64)
	must(t, os.WriteFile(filepath.Join(cfg.CacheDir, stray), []byte("stray"), 0o644))
	must(t, os.WriteFile(filepath.Join(cfg.CacheDir, "."+a.SHA256+".part-123"), []byte("half"), 0o644))
	must(t, os.WriteFile(filepath.Join(cfg.CacheDir, "README"), []byte("not the cache's"), 0o644))

	cfg.Upstream = newRecorder()
	second := startSite(t, cfg)
	must(t, second.SetPlan(planWith(a, b)))
	waitImage(t, second.up, a.SHA256, siteapi.ImageCached)
	waitImage(t, second.up, b.SHA256, siteapi.ImageCached)
	if hits := is.hitsOf("/a.raw"); hits != 1 {
		t.Errorf("a fetched %d times, want once: the restart verified it in the cache", hits)
	}
	if hits := is.hitsOf("/b.raw"); hits != 2 {
		t.Errorf("b fetched %d times, want twice: its damaged copy does not verify", hits)
	}
	if status, body, _ := second.do(t, "GET", "/images/"+b.SHA256, second.imageToken(t, planWith(a, b), b), ""); status != http.StatusOK || body != strings.Repeat("b", 5000) {
		t.Errorf("b after the restart: %d, %.10q…", status, body)
	}
	want := []string{a.SHA256, b.SHA256, "README"}
	slices.Sort(want)
	if got := cacheFiles(t, cfg.CacheDir); !slices.Equal(got, want) {
		t.Errorf("cache directory after the restart holds %v, want %v", got, want)
	}
}

// TestFetchConcurrency: no more images are downloaded at once than FetchConcurrency.
func TestFetchConcurrency(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	is.delay = 30 * time.Millisecond
	var images []siteapi.Image
	for _, n := range []string{"/1", "/2", "/3", "/4"} {
		images = append(images, is.image(n, []byte(n), []byte(n)))
	}
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.FetchConcurrency = 2
	ts := startSite(t, cfg)
	must(t, ts.SetPlan(planWith(images...)))
	for _, im := range images {
		waitImage(t, ts.up, im.SHA256, siteapi.ImageCached)
	}
	if got := is.maxIn.Load(); got != 2 {
		t.Errorf("%d downloads at once, want 2", got)
	}
}

// TestImageStalled: a download that stops bringing bytes is abandoned and reported failed.
func TestImageStalled(t *testing.T) {
	t.Parallel()
	content := bytes.Repeat([]byte("s"), 1<<16)
	sum := sha256.Sum256(content)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		w.Write(content[:1000])
		w.(http.Flusher).Flush()
		<-r.Context().Done() // until the site gives up on it
	}))
	defer srv.Close()
	im := siteapi.Image{ID: "stalled", URL: srv.URL + "/stalled.raw", Format: "raw", SizeBytes: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()), func(s *Server) { s.cache.stall = 200 * time.Millisecond })
	must(t, ts.SetPlan(planWith(im)))
	if st := waitImage(t, ts.up, im.SHA256, siteapi.ImageFailed); !strings.Contains(st.Error, "stalled") {
		t.Errorf("failed with %q, want it to say stalled", st.Error)
	}
	must(t, ts.SetPlan(planWith())) // no more retries while the server closes
	must(t, ts.stop())
}

// TestImagesAreFetchedUnderTheOutboundPolicy: an image's URL is a tenant's choice, so the site
// fetches it only from public addresses (netpolicy, as the control plane would), or from the
// ranges Config.FetchAllow names (a local mirror): an image at loopback fails, saying the
// outbound policy refused it, until loopback is allowed.
func TestImagesAreFetchedUnderTheOutboundPolicy(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	im := is.image("/mirror.raw", bytes.Repeat([]byte("m"), 4096), bytes.Repeat([]byte("m"), 4096))
	dir := t.TempDir()
	cfg := fixture(t, dir, newRecorder())
	cfg.FetchAllow = nil // the fixture allows loopback, where its image servers listen
	ts := startSite(t, cfg)
	must(t, ts.SetPlan(planWith(im)))
	if st := waitImage(t, ts.up, im.SHA256, siteapi.ImageFailed); !strings.Contains(st.Error, "outbound policy") || strings.Contains(st.Error, "127.0.0.1") {
		t.Fatalf("an image at loopback failed with %q, want the outbound policy's refusal, naming no address", st.Error)
	}
	if hits := is.hitsOf("/mirror.raw"); hits != 0 {
		t.Fatalf("the image server was reached %d times", hits)
	}
	must(t, ts.stop())
	cfg = fixture(t, dir, newRecorder())
	cfg.FetchAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	ts = startSite(t, cfg)
	must(t, ts.SetPlan(planWith(im)))
	waitImage(t, ts.up, im.SHA256, siteapi.ImageCached)
}

// TestImageNetworkErrorsNameNoAddress: an image whose name resolves to an address nothing
// listens on fails saying what failed (the connection was refused), never the address the
// site resolved the name to: the image's tenant reads the error (netpolicy.Describe).
func TestImageNetworkErrorsNameNoAddress(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close() // nothing listens there now
	im := siteapi.Image{ID: "closed", URL: "http://localhost:" + port + "/closed.raw", Format: "raw", SizeBytes: 3, SHA256: strings.Repeat("cd", 32)}
	cfg := fixture(t, t.TempDir(), newRecorder())
	cfg.FetchAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	ts := startSite(t, cfg)
	must(t, ts.SetPlan(planWith(im)))
	st := waitImage(t, ts.up, im.SHA256, siteapi.ImageFailed)
	if strings.Contains(st.Error, "127.0.0.1") || strings.Contains(st.Error, "::1") || !strings.Contains(st.Error, "connection refused") {
		t.Errorf("failed with %q: want what failed (connection refused), naming no address", st.Error)
	}
	must(t, ts.SetPlan(planWith()))
	must(t, ts.stop())
}
