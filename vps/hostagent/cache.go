package hostagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/better-compute/compute/vps/hostapi"
)

// cache keeps the images instances boot, by their SHA-256: fetched once, checked before they are
// kept, shared by every instance that boots them (each gets its own copy-on-write disk from the
// runtime).
type cache struct {
	dir  string
	http *http.Client
	mu   sync.Mutex // one fetch at a time: two instances of one image fetch it once
}

// get returns the local path of art, fetching it when the cache does not have it. A file whose
// content does not match its checksum is never kept.
func (c *cache) get(ctx context.Context, art hostapi.Artifact) (string, error) {
	if !hostapi.ValidSHA256(art.SHA256) {
		return "", fmt.Errorf("image %s: its sha256 %q is not 64 lower-case hex digits", art.URL, art.SHA256)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := filepath.Join(c.dir, art.SHA256)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	src, err := c.open(ctx, art.URL)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", art.URL, err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(c.dir, ".fetch-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(tmp, h), src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("image %s: %w", art.URL, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != art.SHA256 {
		return "", fmt.Errorf("image %s: its sha256 is %s, not %s as its image says: not used", art.URL, got, art.SHA256)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil { // the hypervisor's user reads it
		return "", err
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return "", err
	}
	return p, nil
}

// open reads an image from an http(s) URL. Never a file on the host: a tenant who knows a host
// file's checksum could otherwise boot a VM from it.
func (c *cache) open(ctx context.Context, raw string) (io.ReadCloser, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch u.Scheme {
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("GET answered %s", resp.Status)
		}
		return resp.Body, nil
	}
	return nil, fmt.Errorf("scheme %q: images are fetched over http or https", u.Scheme)
}
