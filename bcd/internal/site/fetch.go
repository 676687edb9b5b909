package site

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
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// ensure makes the cache hold im verified: a file already there is verified (once per run)
// and kept if it matches; otherwise the image is downloaded.
func (c *cache) ensure(ctx context.Context, im siteapi.Image) error {
	path := c.path(im.SHA256)
	if _, err := os.Stat(path); err == nil {
		err := verifyFile(ctx, path, im)
		if err == nil {
			c.log.Info("cached image verified", "sha256", im.SHA256)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Warn("cached image does not verify: fetching it again", "sha256", im.SHA256, "err", err)
		c.removeFile(im.SHA256)
	}
	return c.download(ctx, im, path)
}

var errStalled = errors.New("no byte received for too long")

// download fetches im into a temporary file, verifies its size and SHA-256 as it goes, and
// renames it to path once it matches.
func (c *cache) download(ctx context.Context, im siteapi.Image, path string) (err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(c.stall, func() { cancel(errStalled) })
	defer watchdog.Stop()
	defer func() {
		if cause := context.Cause(ctx); err != nil && errors.Is(cause, errStalled) {
			err = fmt.Errorf("%s: stalled: %w", safeURL(im.URL), cause)
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, im.URL, nil)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	if im.Authorization != "" {
		// The image's pull token: Go's client drops it on a redirect to another host.
		req.Header.Set("Authorization", im.Authorization)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message holds the whole URL, and a URL may hold a secret
		}
		return fmt.Errorf("%s: %w", safeURL(im.URL), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", safeURL(im.URL), resp.Status)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != im.SizeBytes {
		return fmt.Errorf("size: %s sends %d bytes, the plan says %d", safeURL(im.URL), resp.ContentLength, im.SizeBytes)
	}
	tmp, err := os.CreateTemp(c.dir, "."+im.SHA256+".part-")
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	body := &activeReader{r: resp.Body, t: watchdog, d: c.stall}
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(body, im.SizeBytes+1))
	if err != nil {
		return fmt.Errorf("%s: after %d bytes: %w", safeURL(im.URL), n, err)
	}
	if n != im.SizeBytes {
		return fmt.Errorf("size: %s sent %d bytes or more, the plan says %d", safeURL(im.URL), n, im.SizeBytes)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != im.SHA256 {
		return fmt.Errorf("sha256: %s sent bytes whose SHA-256 is %s, the plan says %s", safeURL(im.URL), sum, im.SHA256)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	tmp = nil
	syncDir(c.dir)
	return nil
}

// verifyFile checks a cached file's size and SHA-256 against the plan.
func verifyFile(ctx context.Context, path string, im siteapi.Image) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() != im.SizeBytes {
		return fmt.Errorf("size: %d bytes, the plan says %d", fi.Size(), im.SizeBytes)
	}
	h := sha256.New()
	if _, err := io.Copy(h, &ctxReader{ctx: ctx, r: f}); err != nil {
		return err
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != im.SHA256 {
		return fmt.Errorf("sha256: %s, the plan says %s", sum, im.SHA256)
	}
	return nil
}

// activeReader pushes a watchdog back at every read that brings bytes.
type activeReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (a *activeReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.t.Reset(a.d)
	}
	return n, err
}

// ctxReader stops reading once ctx ends (hashing a large file takes a while).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// safeURL is a URL as logs and reports show it: without its user information and query, where
// a signed URL keeps its secret.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the image URL"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
