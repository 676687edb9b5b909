package hostagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/runtime"
)

// cache keeps the images instances boot, by their SHA-256, in cache/<sha256>: one copy of each,
// shared by every instance that boots it (each gets its own copy-on-write disk from the
// runtime). A checksum names bytes; it does not prove that whoever names it may have them. So a
// tenant (an instance's scope) is given a cached image only once it has fetched those bytes
// from its own URL and they matched: cache/tenants/<scope>/<sha256>, an empty file, records
// that it did. Every image is checked before it is kept or given: its checksum, and what it
// would make a hypervisor open (runtime.CheckImage).
type cache struct {
	dir      string
	http     *http.Client
	qemuImg  string
	maxBytes int64      // the largest image fetched: a tenant's URL could serve bytes without end
	mu       sync.Mutex // one fetch at a time: two instances of one image fetch it once
}

// scope is whose images an instance boots: its tenant's, or, from a control plane that names
// no tenant, its own. Hashed, so that any tenant id is a safe file name.
func scope(in hostapi.Instance) string {
	s := "tenant:" + in.Tenant
	if in.Tenant == "" {
		s = "instance:" + in.ID
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// get returns the local path of art for scope, and the format it is booted as, fetching it when
// scope has not fetched it. A file whose content does not match its checksum, or that names
// another file, is never kept.
func (c *cache) get(ctx context.Context, scope string, art hostapi.Artifact) (path, format string, err error) {
	if !hostapi.ValidSHA256(art.SHA256) {
		return "", "", fmt.Errorf("image %s: its sha256 %q is not 64 lower-case hex digits", art.URL, art.SHA256)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := filepath.Join(c.dir, art.SHA256)
	fetched := filepath.Join(c.dir, "tenants", scope, art.SHA256)
	if _, err := os.Stat(fetched); err == nil {
		if _, err := os.Stat(p); err == nil {
			format, err := runtime.ImageFormat(p)
			return p, format, err
		}
	}
	tmp, err := c.fetch(ctx, art)
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp) // a no-op once renamed
	// Checked whether or not the cache has these bytes already: a copy kept before images were
	// checked is checked now, as it is given to a tenant.
	format, err = runtime.ImageFormat(tmp)
	if err != nil {
		return "", "", err
	}
	if format != runtime.FormatRaw { // a raw image names nothing, and needs no qemu-img
		if _, err := runtime.CheckImage(ctx, c.qemuImg, tmp, format); err != nil {
			return "", "", fmt.Errorf("image %s: %w: not used", art.URL, err)
		}
	}
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		if err := os.Chmod(tmp, 0o644); err != nil { // the hypervisor's user reads it
			return "", "", err
		}
		if err := os.Rename(tmp, p); err != nil {
			return "", "", err
		}
	} else if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(filepath.Dir(fetched), 0o700); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(fetched, nil, 0o600); err != nil {
		return "", "", err
	}
	return p, format, nil
}

// fetch writes art's bytes to a temporary file in the cache, and returns its path once they
// match art's checksum.
func (c *cache) fetch(ctx context.Context, art hostapi.Artifact) (string, error) {
	src, err := c.open(ctx, art.URL)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", art.URL, err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(c.dir, ".fetch-*")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(src, c.maxBytes+1))
	if err == nil && n > c.maxBytes {
		err = fmt.Errorf("it is larger than this host takes (%d bytes, bcd node --vps-image-max-gib): not used", c.maxBytes)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != art.SHA256 {
			err = fmt.Errorf("its sha256 is %s, not %s as its image says: not used", got, art.SHA256)
		}
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("image %s: %w", art.URL, err)
	}
	return tmp.Name(), nil
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
