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

// StallTimeout is how long a download may receive nothing before it is given up (and, for a
// deploy, started over): a connection that hangs must not hang the ramdisk.
const StallTimeout = time.Minute

// streamBuffer is how much Stream reads before each write: large writes, few syscalls.
const streamBuffer = 4 << 20

// streamOptions are Stream's pace: how often it reports progress and when it gives up on a
// silent site. Tests shorten them.
type streamOptions struct {
	progressBytes    int64
	progressInterval time.Duration
	stall            time.Duration
}

// Stream writes a raw image to disk as it downloads it: a GET of src (the site's
// <site>/images/<sha256>, with the boot's token as its bearer when token is not ""), written
// from the disk's first byte through a SHA-256 hasher, then
// synced; the byte count must be img.SizeBytes and the digest img.SHA256. progress, if not
// nil, is called with the bytes written so far (see ProgressBytes). A format other than raw is
// refused before anything is fetched or written, and so is an image larger than the block
// device. On any error once the disk is open (the site's answer, a read cut short or stalled
// for StallTimeout, too many or too few bytes, another digest, a failed write) the disk is
// wiped as by Wipe before Stream returns, so a partial or wrong image never boots; the error
// names what differed. A retry starts over.
func Stream(ctx context.Context, c *http.Client, src, token string, img siteapi.Image, disk string, progress func(written int64)) error {
	return stream(ctx, c, src, token, img, disk, progress, streamOptions{ProgressBytes, ProgressInterval, StallTimeout})
}

func stream(ctx context.Context, c *http.Client, src, token string, img siteapi.Image, disk string, progress func(int64), opt streamOptions) error {
	if err := checkFormat(img); err != nil {
		return err
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
	written, err := d.write(ctx, c, src, token, img, progress, opt)
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

// checkFormat refuses the formats the ramdisk does not write.
func checkFormat(img siteapi.Image) error {
	if img.Format != FormatRaw {
		return fmt.Errorf("ramdisk: image %s is in format %q: only %s images are streamed (qcow2 and tar are not yet)", img.ID, img.Format, FormatRaw)
	}
	return nil
}

// write streams the image onto the disk, returning how many bytes it wrote.
func (d *target) write(ctx context.Context, c *http.Client, src, token string, img siteapi.Image, progress func(int64), opt streamOptions) (int64, error) {
	if d.block && d.size < img.SizeBytes {
		return 0, fmt.Errorf("ramdisk: image %s is %d bytes; disk %s is only %d", img.ID, img.SizeBytes, d.path, d.size)
	}
	resp, body, err := get(ctx, c, src, token, opt.stall)
	if err != nil {
		return 0, fmt.Errorf("ramdisk: image %s: %w", img.ID, err)
	}
	defer body.Close()
	if resp.ContentLength >= 0 && resp.ContentLength != img.SizeBytes {
		return 0, fmt.Errorf("ramdisk: image %s: the site serves %d bytes; the image is %d", img.ID, resp.ContentLength, img.SizeBytes)
	}

	h := sha256.New()
	buf := make([]byte, streamBuffer)
	var written, reported int64
	lastReport := time.Now()
	for {
		n, rerr := fill(body, buf)
		if written+int64(n) > img.SizeBytes {
			return written, fmt.Errorf("ramdisk: image %s: the site sent more than its %d bytes", img.ID, img.SizeBytes)
		}
		if n > 0 {
			if _, err := d.f.WriteAt(buf[:n], written); err != nil {
				return written, fmt.Errorf("ramdisk: image %s: writing disk %s at byte %d: %w", img.ID, d.path, written, err)
			}
			h.Write(buf[:n])
			written += int64(n)
			if progress != nil && (written-reported >= opt.progressBytes || time.Since(lastReport) >= opt.progressInterval) {
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

// get GETs src (with token as its bearer, when not "") and returns its answer when it is 200
// OK, with a body that fails (its error naming the stall) once nothing has come for stall. Its
// errors are transient when the network or the site's trouble caused them, errNotCached for a
// 404.
func get(ctx context.Context, c *http.Client, src, token string, stall time.Duration) (*http.Response, io.ReadCloser, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(stall, func() { cancel(fmt.Errorf("nothing received for %v", stall)) })
	stop := func() { timer.Stop(); cancel(nil) }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		stop()
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		stop()
		if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
			err = cause
		}
		return nil, nil, transient(fmt.Errorf("GET %s: %w", src, err))
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		stop()
		err := fmt.Errorf("GET %s: %s", src, resp.Status)
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return nil, nil, &notCachedError{err}
		case retryStatus(resp.StatusCode):
			return nil, nil, transient(err)
		}
		return nil, nil, err
	}
	return resp, &stallReader{ctx: ctx, body: resp.Body, timer: timer, stall: stall, stop: stop}, nil
}

// stallReader is a body whose reads push its stall timer back.
type stallReader struct {
	ctx   context.Context
	body  io.ReadCloser
	timer *time.Timer
	stall time.Duration
	stop  func()
}

func (r *stallReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if n > 0 {
		r.timer.Reset(r.stall)
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(r.ctx); cause != nil && cause != context.Canceled {
			err = cause
		}
	}
	return n, err
}

func (r *stallReader) Close() error {
	r.stop()
	return r.body.Close()
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

// notCachedError is a site's 404 for an image: its cache does not have it yet.
type notCachedError struct{ err error }

func (e *notCachedError) Error() string { return e.err.Error() + " (not in the site's cache yet)" }
func (e *notCachedError) Unwrap() error { return e.err }

func isNotCached(err error) bool {
	var n *notCachedError
	return errors.As(err, &n)
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
