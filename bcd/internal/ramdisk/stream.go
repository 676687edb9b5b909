package ramdisk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// FormatRaw is the one image format the ramdisk writes: the disk's bytes, from its first
// sector. qcow2 and tar images are not streamed yet.
const FormatRaw = "raw"

// How often Stream reports progress: after every ProgressBytes written or ProgressInterval
// passed, whichever comes first, and once at the end.
const (
	ProgressBytes    = 64 << 20
	ProgressInterval = time.Second
)

// streamBuffer is how much Stream reads before each write: large writes, few syscalls.
const streamBuffer = 4 << 20

// progressEvery is how often stream reports progress.
type progressEvery struct {
	bytes    int64
	interval time.Duration
}

// Stream writes a raw image to disk as it downloads it: a GET of src (the site's
// <site>/images/<sha256>), written from the disk's first byte through a SHA-256 hasher, then
// synced; the byte count must be img.SizeBytes and the digest img.SHA256. progress, if not
// nil, is called with the bytes written so far (see ProgressBytes). A format other than raw,
// or an image that does not fit the disk, is refused. On any error once the disk is open (the
// site's answer, a read cut short, too many or too few bytes, another digest, a failed write)
// the disk is wiped as by Wipe before Stream returns, so a partial or wrong image never boots;
// the error names what differed. A retry starts over.
func Stream(ctx context.Context, c *http.Client, src string, img siteapi.Image, disk string, progress func(written int64)) error {
	return stream(ctx, c, src, img, disk, progress, progressEvery{ProgressBytes, ProgressInterval})
}

func stream(ctx context.Context, c *http.Client, src string, img siteapi.Image, disk string, progress func(int64), every progressEvery) error {
	if img.Format != FormatRaw {
		return fmt.Errorf("ramdisk: image %s is in format %q: only %s images are streamed (qcow2 and tar are not yet)", img.ID, img.Format, FormatRaw)
	}
	if err := img.Validate(); err != nil {
		return fmt.Errorf("ramdisk: image %s: %w", img.ID, err)
	}
	if c == nil {
		c = http.DefaultClient
	}
	d, err := openDisk(disk, true)
	if err != nil {
		return err
	}
	defer d.f.Close()
	written, err := d.write(ctx, c, src, img, progress, every)
	if err != nil {
		if werr := d.wipe(written); werr != nil {
			return fmt.Errorf("%w; and wiping what was written failed too: %v", err, werr)
		}
		return err
	}
	if d.block {
		_ = rereadPartitions(d.f) // the new image's partitions; the booted kernel reads them anyway
	}
	return d.f.Close()
}

// write streams the image onto the disk, returning how many bytes it wrote.
func (d *target) write(ctx context.Context, c *http.Client, src string, img siteapi.Image, progress func(int64), every progressEvery) (int64, error) {
	if d.block && d.size < img.SizeBytes {
		return 0, fmt.Errorf("ramdisk: image %s is %d bytes; disk %s is only %d", img.ID, img.SizeBytes, d.path, d.size)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		return 0, fmt.Errorf("ramdisk: image %s: %w", img.ID, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, transient(fmt.Errorf("ramdisk: image %s: GET %s: %w", img.ID, src, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("ramdisk: image %s: GET %s: %s", img.ID, src, resp.Status)
		if retryStatus(resp.StatusCode) || resp.StatusCode == http.StatusNotFound { // 404: not cached yet
			err = transient(err)
		}
		return 0, err
	}
	if resp.ContentLength >= 0 && resp.ContentLength != img.SizeBytes {
		return 0, fmt.Errorf("ramdisk: image %s: the site serves %d bytes; the image is %d", img.ID, resp.ContentLength, img.SizeBytes)
	}

	h := sha256.New()
	buf := make([]byte, streamBuffer)
	var written, reported int64
	lastReport := time.Now()
	for {
		n, rerr := fill(resp.Body, buf)
		if written+int64(n) > img.SizeBytes {
			return written, fmt.Errorf("ramdisk: image %s: the site sent more than its %d bytes", img.ID, img.SizeBytes)
		}
		if n > 0 {
			if _, err := d.f.WriteAt(buf[:n], written); err != nil {
				return written, fmt.Errorf("ramdisk: image %s: writing disk %s at byte %d: %w", img.ID, d.path, written, err)
			}
			h.Write(buf[:n])
			written += int64(n)
			if progress != nil && (written-reported >= every.bytes || time.Since(lastReport) >= every.interval) {
				progress(written)
				reported, lastReport = written, time.Now()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return written, fmt.Errorf("ramdisk: image %s: stopped after %d of %d bytes: %w", img.ID, written, img.SizeBytes, ctx.Err())
			}
			return written, transient(fmt.Errorf("ramdisk: image %s: reading it after %d of %d bytes: %w", img.ID, written, img.SizeBytes, rerr))
		}
	}
	if written != img.SizeBytes {
		return written, fmt.Errorf("ramdisk: image %s ended after %d of its %d bytes", img.ID, written, img.SizeBytes)
	}
	if err := d.f.Sync(); err != nil {
		return written, fmt.Errorf("ramdisk: image %s: sync disk %s: %w", img.ID, d.path, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != img.SHA256 {
		return written, fmt.Errorf("ramdisk: image %s: the %d bytes received have SHA-256 %s; the image's is %s", img.ID, written, sum, img.SHA256)
	}
	if progress != nil && reported != written {
		progress(written)
	}
	return written, nil
}

// fill reads into buf until it is full, the reader ends (io.EOF, with what was read before)
// or fails.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Verify reads the image back from the disk, after dropping the disk's cached pages so that
// the bytes come from the device, and checks them against img.SHA256: a deploy's proof that
// the disk holds the image. It does not wipe; the caller decides.
func Verify(ctx context.Context, disk string, img siteapi.Image) error {
	d, err := openDisk(disk, false)
	if err != nil {
		return err
	}
	defer d.f.Close()
	_ = dropCache(d.f, 0, img.SizeBytes) // best effort: a read from memory still checks the writes
	h := sha256.New()
	n, err := io.Copy(h, &ctxReader{ctx: ctx, r: io.NewSectionReader(d.f, 0, img.SizeBytes)})
	if err != nil {
		return fmt.Errorf("ramdisk: verify %s: reading it back after %d bytes: %w", disk, n, err)
	}
	if n != img.SizeBytes {
		return fmt.Errorf("ramdisk: verify %s: the disk holds %d bytes; image %s is %d", disk, n, img.ID, img.SizeBytes)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != img.SHA256 {
		return fmt.Errorf("ramdisk: verify %s: its first %d bytes have SHA-256 %s; image %s's is %s", disk, n, sum, img.ID, img.SHA256)
	}
	return nil
}

// ctxReader stops reading once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// transientError is a failure worth retrying: the network, or the site not ready.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

func transient(err error) error { return &transientError{err} }

// isTransient reports whether err is worth retrying.
func isTransient(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

// retryStatus reports whether an HTTP status is the site's passing trouble.
func retryStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}
