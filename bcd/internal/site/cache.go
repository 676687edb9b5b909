package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
	"github.com/better-compute/compute/netpolicy"
)

// How the cache retries an image that failed (exponential backoff between these bounds), and
// how long a download may go without a byte before it is abandoned.
const (
	fetchRetryMin = time.Second
	fetchRetryMax = 5 * time.Minute
	fetchStall    = time.Minute
)

// cache is the site's image cache: CacheDir holds <sha256> files, each verified against the
// plan's size and SHA-256 before it is served, and nothing the plan does not name. Downloads
// go to a temporary file (.<sha256>.part-*) renamed once verified.
type cache struct {
	dir      string
	log      *slog.Logger
	reports  *reporter
	client   *http.Client
	slots    int
	retryMin time.Duration
	retryMax time.Duration
	stall    time.Duration

	mu      sync.Mutex
	planned bool                     // a plan has arrived: files it does not name may go
	wanted  map[string]siteapi.Image // the plan's images by SHA-256
	entries map[string]*entry
	wake    chan struct{}
}

type entryState int

const (
	stateIdle    entryState = iota // to verify or fetch
	stateWorking                   // a worker verifies or fetches it
	stateCached                    // verified: served
	stateFailed                    // waiting for retryAt
)

type entry struct {
	image   siteapi.Image
	state   entryState
	cancel  context.CancelFunc // stateWorking
	retryAt time.Time          // stateFailed
	wait    time.Duration      // the next backoff
}

func newCache(dir string, slots int, policy *netpolicy.Policy, reports *reporter, log *slog.Logger) *cache {
	tr := policy.Transport()
	tr.ResponseHeaderTimeout = 30 * time.Second
	return &cache{
		dir: dir, log: log.With("part", "cache"), reports: reports,
		client: &http.Client{Transport: tr, CheckRedirect: policy.CheckRedirect}, slots: slots,
		retryMin: fetchRetryMin, retryMax: fetchRetryMax, stall: fetchStall,
		entries: map[string]*entry{}, wake: make(chan struct{}, 1),
	}
}

// want sets the images the plan names.
func (c *cache) want(images map[string]siteapi.Image) {
	c.mu.Lock()
	c.wanted, c.planned = images, true
	c.mu.Unlock()
	c.poke()
}

func (c *cache) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// prepare creates the cache directory and removes the temporary files of an earlier run.
func (c *cache) prepare() error {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("site: image cache: %w", err)
	}
	names, err := c.list()
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, ok := partOf(n); ok {
			c.removeFile(n)
		}
	}
	return nil
}

// run keeps the directory converged to the plan until ctx ends, then waits for its workers.
func (c *cache) run(ctx context.Context) {
	var workers sync.WaitGroup
	defer c.client.CloseIdleConnections()
	defer workers.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := c.reconcile(ctx, &workers)
		if next.IsZero() {
			timer.Reset(time.Hour)
		} else {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// reconcile removes what left the plan, starts work on what it names (as many at once as
// slots allow), and returns when the next retry is due (zero: none waits).
func (c *cache) reconcile(ctx context.Context, workers *sync.WaitGroup) (next time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.planned {
		return time.Time{}
	}
	working := 0 // cancelled workers count until they have stopped
	for sha, e := range c.entries {
		_, wanted := c.wanted[sha]
		if e.state == stateWorking {
			working++
		}
		switch {
		case wanted:
		case e.state == stateWorking:
			e.cancel() // the worker removes what it wrote
		default:
			c.removeFile(sha)
			delete(c.entries, sha)
			c.log.Info("image removed: it left the plan", "sha256", sha)
		}
	}
	c.sweep()
	now := time.Now()
	for _, sha := range slices.Sorted(maps.Keys(c.wanted)) {
		im := c.wanted[sha]
		e := c.entries[sha]
		if e == nil {
			e = &entry{image: im, wait: c.retryMin}
			c.entries[sha] = e
		}
		if e.state == stateFailed && e.image.URL != im.URL {
			e.state = stateIdle // a new place to fetch it from: try it now
		}
		e.image = im
		if e.state == stateFailed {
			if now.Before(e.retryAt) {
				if next.IsZero() || e.retryAt.Before(next) {
					next = e.retryAt
				}
				continue
			}
			e.state = stateIdle
		}
		if e.state == stateIdle && working < c.slots {
			wctx, cancel := context.WithCancel(ctx)
			e.state, e.cancel = stateWorking, cancel
			working++
			workers.Go(func() { c.work(ctx, wctx, im) })
		}
	}
	return next
}

// sweep removes the files of the directory that are no entry's: images of an earlier run's
// plan, and temporary files no worker writes.
func (c *cache) sweep() {
	names, err := c.list()
	if err != nil {
		c.log.Error("image cache not listed", "err", err)
		return
	}
	for _, n := range names {
		sha, part := partOf(n)
		if !part && siteapi.ValidSHA256(n) {
			sha = n
		} else if !part {
			continue // not the cache's
		}
		if e := c.entries[sha]; e != nil && (e.state == stateWorking || !part) {
			continue
		}
		if _, wanted := c.wanted[sha]; wanted && !part {
			continue // verified before it is served
		}
		c.removeFile(n)
		if !part {
			c.log.Info("image removed: no plan names it", "sha256", sha)
		}
	}
}

// work verifies or fetches one image under ctx (the image's, cancelled when it leaves the plan),
// records the outcome and reports it up (until runCtx, the cache's, ends).
func (c *cache) work(runCtx, ctx context.Context, im siteapi.Image) {
	defer c.poke()
	err := c.ensure(ctx, im)
	c.mu.Lock()
	e := c.entries[im.SHA256]
	_, wanted := c.wanted[im.SHA256]
	if e == nil || !wanted {
		c.removeFile(im.SHA256)
		delete(c.entries, im.SHA256)
		c.mu.Unlock()
		c.log.Info("image removed: it left the plan", "sha256", im.SHA256)
		return
	}
	stopped := ctx.Err() != nil // stopping, or it left the plan and came back: start over
	e.cancel()
	if stopped {
		e.state = stateIdle
		c.mu.Unlock()
		return
	}
	state := siteapi.ImageState{SHA256: im.SHA256, State: siteapi.ImageCached}
	if err == nil {
		e.state, e.wait = stateCached, c.retryMin
	} else {
		e.state, e.retryAt = stateFailed, time.Now().Add(jitter(e.wait))
		e.wait = min(2*e.wait, c.retryMax)
		state.State, state.Error = siteapi.ImageFailed, tenantError(err)
	}
	retryIn := time.Until(e.retryAt).Round(time.Millisecond)
	c.mu.Unlock()
	if err == nil {
		c.log.Info("image cached", "sha256", im.SHA256, "bytes", im.SizeBytes)
	} else {
		c.log.Warn("image not cached", "sha256", im.SHA256, "url", safeURL(im.URL), "retry_in", retryIn, "err", err)
	}
	c.reports.send(runCtx, siteapi.KindImageCached, state)
}

// tenantError is a fetch's error as the image's tenant reads it: a network error (the outbound
// policy's refusal, a name that did not resolve, a connection that failed) as what failed,
// never its text, which may name the site's resolver, its own address or the address a name
// resolved to (netpolicy.Describe); the site's log keeps it whole. The rest (an HTTP status, a
// size or SHA-256 that is not the plan's) is the tenant's to read.
func tenantError(err error) string {
	if errors.As(err, new(*netpolicy.RefusedError)) || errors.As(err, new(*net.OpError)) || errors.As(err, new(*net.DNSError)) {
		return netpolicy.Describe(err)
	}
	return err.Error()
}

// open opens a verified image of the plan for serving.
func (c *cache) open(sha string) (*os.File, bool) {
	c.mu.Lock()
	e := c.entries[sha]
	_, wanted := c.wanted[sha]
	ok := e != nil && wanted && e.state == stateCached
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	f, err := os.Open(c.path(sha))
	if err != nil {
		c.log.Error("cached image unreadable: fetching it again", "sha256", sha, "err", err)
		c.mu.Lock()
		if e.state == stateCached {
			e.state = stateIdle
		}
		c.mu.Unlock()
		c.poke()
		return nil, false
	}
	return f, true
}

func (c *cache) path(name string) string { return filepath.Join(c.dir, name) }

func (c *cache) list() ([]string, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("site: image cache: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func (c *cache) removeFile(name string) {
	if err := os.Remove(c.path(name)); err != nil && !os.IsNotExist(err) {
		c.log.Error("image cache: file not removed", "file", name, "err", err)
	}
}

// partOf parses a temporary file's name, .<sha256>.part-*.
func partOf(name string) (sha string, ok bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return "", false
	}
	sha, _, ok = strings.Cut(rest, ".part-")
	return sha, ok && siteapi.ValidSHA256(sha)
}
