package ramdisk

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// testImage is a raw image of size random bytes, and its siteapi description.
func testImage(t *testing.T, size int) ([]byte, siteapi.Image) {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return b, siteapi.Image{ID: "img-1", URL: "https://images.example/debian.raw", Format: FormatRaw, SizeBytes: int64(size), SHA256: hex.EncodeToString(sum[:])}
}

// serve is an image server answering every GET with h, closed when the test ends.
func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// bytesOf serves b with its length.
func bytesOf(b []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

// progressLog records what Stream reports.
type progressLog struct {
	mu sync.Mutex
	n  []int64
}

func (p *progressLog) add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = append(p.n, n)
}

// check fails the test unless the reports rise strictly and end at total.
func (p *progressLog) check(t *testing.T, total int64, atLeast int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.n) < atLeast {
		t.Fatalf("%d progress reports (%v), want at least %d", len(p.n), p.n, atLeast)
	}
	for i := 1; i < len(p.n); i++ {
		if p.n[i] <= p.n[i-1] {
			t.Fatalf("progress went from %d to %d: not monotonic (%v)", p.n[i-1], p.n[i], p.n)
		}
	}
	if last := p.n[len(p.n)-1]; last != total {
		t.Fatalf("last progress %d, want the image's %d bytes", last, total)
	}
}

func TestStreamWritesAndVerifiesAGoodImage(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 5<<20+123) // two reads of the 4 MiB buffer, not sector-aligned
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer boot-token" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		bytesOf(img)(w, r)
	})
	disk := oldDisk(t, 8<<20)
	var p progressLog
	if err := Stream(t.Context(), srv.Client(), srv.URL+"/images/"+desc.SHA256, "", desc, disk, p.add); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Stream without the boot's token: %v, want the site's 401", err)
	}
	if err := Stream(t.Context(), srv.Client(), srv.URL+"/images/"+desc.SHA256, "boot-token", desc, disk, p.add); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, disk)
	if !bytes.Equal(got[:len(img)], img) {
		t.Fatal("the disk does not hold the image byte for byte")
	}
	if len(got) != 8<<20 {
		t.Errorf("the disk is %d bytes, was %d", len(got), 8<<20)
	}
	p.check(t, desc.SizeBytes, 1)
	if err := Verify(t.Context(), disk, desc); err != nil {
		t.Errorf("Verify of a good image: %v", err)
	}
}

func TestStreamReportsProgressAsItGoes(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 10<<20)
	srv := serve(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(img)))
		for chunk := range slices.Chunk(img, 1<<20) { // a slow site: a MiB at a time
			w.Write(chunk)
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond) // the slowness is the behaviour tested, not a wait
		}
	})
	disk := oldDisk(t, 10<<20)
	var p progressLog
	if err := stream(t.Context(), srv.Client(), srv.URL, "", desc, disk, p.add, streamOptions{progressBytes: 1 << 20, progressInterval: time.Hour, stall: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p.check(t, desc.SizeBytes, 3)
}

func TestStreamGivesUpOnASilentSite(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 2<<20)
	release := make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(img)))
		w.Write(img[:1<<20])
		w.(http.Flusher).Flush()
		select { // then nothing, until the test ends or the client goes
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	disk := oldDisk(t, 4<<20)
	err := stream(t.Context(), srv.Client(), srv.URL, "", desc, disk, nil, streamOptions{progressBytes: 1 << 20, progressInterval: time.Hour, stall: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "nothing received for 200ms") || !isTransient(err) {
		t.Fatalf("err = %v, want a transient one naming the stall", err)
	}
	checkWiped(t, readAll(t, disk))
}

func TestVerifyFindsADiskThatDiffers(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 3<<20)
	disk := oldDisk(t, 4<<20)
	srv := serve(t, bytesOf(img))
	if err := Stream(t.Context(), srv.Client(), srv.URL, "", desc, disk, nil); err != nil {
		t.Fatal(err)
	}
	b := readAll(t, disk)
	b[2<<20] ^= 1
	if err := os.WriteFile(disk, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Verify(t.Context(), disk, desc); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("Verify of a disk with one bit flipped: err = %v, want a SHA-256 mismatch", err)
	}
	short := oldDisk(t, 1<<20)
	if err := Verify(t.Context(), short, desc); err == nil || !strings.Contains(err.Error(), "holds 1048576 bytes") {
		t.Errorf("Verify of a disk smaller than the image: err = %v", err)
	}
}

// TestStreamWipesAfterABadImage serves wrong images; each must fail with an error naming what
// differed and leave the disk wiped, never holding the start of an image.
func TestStreamWipesAfterABadImage(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 5<<20)
	corrupt := bytes.Clone(img)
	corrupt[len(corrupt)-1] ^= 0xff
	cases := []struct {
		name    string
		h       http.HandlerFunc
		wantErr string
	}{
		{"truncated", bytesOf(img[:3<<20]), "the site serves 3145728 bytes; the image is 5242880"},
		{"cut off mid-way", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(img)))
			w.Write(img[:3<<20])
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}, "reading it after"},
		{"ends early without a length", func(w http.ResponseWriter, _ *http.Request) {
			w.Write(img[:3<<20])
			w.(http.Flusher).Flush() // chunked: no Content-Length
		}, "ended after 3145728 of its 5242880 bytes"},
		{"oversized", bytesOf(append(bytes.Clone(img), 1, 2, 3)), "the site serves 5242883 bytes; the image is 5242880"},
		{"oversized without a length", func(w http.ResponseWriter, _ *http.Request) {
			w.(http.Flusher).Flush()
			w.Write(img)
			w.Write([]byte("more"))
		}, "more than its 5242880 bytes"},
		{"corrupted", bytesOf(corrupt), "SHA-256"},
		{"not cached", http.NotFound, "404 Not Found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := serve(t, c.h)
			disk := oldDisk(t, 8<<20)
			err := Stream(t.Context(), srv.Client(), srv.URL, "", desc, disk, nil)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want one saying %q", err, c.wantErr)
			}
			b := readAll(t, disk)
			checkWiped(t, b)
			if bytes.Contains(b, img[:4096]) {
				t.Error("the disk still holds the start of the image")
			}
		})
	}
}

func TestStreamRefusesWhatItCannotWrite(t *testing.T) {
	t.Parallel()
	img, desc := testImage(t, 1<<20)
	var gets int
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { gets++; bytesOf(img)(w, r) })
	disk := oldDisk(t, 2<<20)
	for _, format := range []string{"qcow2", "tar", ""} {
		d := desc
		d.Format = format
		err := Stream(t.Context(), srv.Client(), srv.URL, "", d, disk, nil)
		if err == nil || !strings.Contains(err.Error(), "only raw images are streamed (qcow2 and tar are not yet)") {
			t.Errorf("format %q: err = %v", format, err)
		}
	}
	d := desc
	d.SHA256 = strings.ToUpper(d.SHA256)
	if err := Stream(t.Context(), srv.Client(), srv.URL, "", d, disk, nil); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("an uppercase digest: err = %v", err)
	}
	if gets != 0 {
		t.Errorf("the image was fetched %d times for images that are refused", gets)
	}
	if b := readAll(t, disk); !bytes.Equal(b, bytes.Repeat([]byte{0xAA}, 2<<20)) {
		t.Error("a refused image changed the disk")
	}
}

func TestStreamOntoALoopDevice(t *testing.T) {
	img, desc := testImage(t, 3<<20+512)
	srv := serve(t, bytesOf(img))
	dev, file := loopDevice(t, 6<<20)
	var p progressLog
	if err := Stream(t.Context(), srv.Client(), srv.URL, "", desc, dev, p.add); err != nil {
		t.Fatal(err)
	}
	p.check(t, desc.SizeBytes, 1)
	if err := Verify(t.Context(), dev, desc); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, file); !bytes.Equal(b[:len(img)], img) {
		t.Fatal("the file behind the loop device does not hold the image")
	}

	// A corrupted image onto the same device: refused, and the device wiped.
	bad := bytes.Clone(img)
	bad[0] ^= 1
	srv2 := serve(t, bytesOf(bad))
	if err := Stream(t.Context(), srv2.Client(), srv2.URL, "", desc, dev, nil); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("a corrupted image: err = %v", err)
	}
	checkWiped(t, readAll(t, dev))

	// An image larger than the device: refused before it is fetched.
	_, big := testImage(t, 7<<20)
	if err := Stream(t.Context(), srv.Client(), srv.URL, "", big, dev, nil); err == nil || !strings.Contains(err.Error(), "is only 6291456") {
		t.Fatalf("an image larger than the disk: err = %v", err)
	}
}
