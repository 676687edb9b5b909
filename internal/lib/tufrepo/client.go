package tufrepo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"
	"github.com/theupdateframework/go-tuf/v2/metadata/config"
	"github.com/theupdateframework/go-tuf/v2/metadata/updater"
)

// Client fetches a build from a repository served at NodePath, verified by go-tuf's updater as
// the TUF client workflow says: the chain of roots from the one trusted, then a timestamp,
// snapshot and targets that are signed by their roles' keys, unexpired, and no older than those
// seen before (kept in Dir, so a server cannot roll a node back to metadata it replaced), then
// the target's length and hashes.
type Client struct {
	// BaseURL is the server, e.g. https://gateway.example.com:443.
	BaseURL string
	// HTTP is the client the node reaches it with (its mutual TLS).
	HTTP *http.Client
	// Dir keeps the trusted metadata between fetches.
	Dir string
	// Root, if set, is the root metadata trusted first (a pinned root.json). Without it, and
	// before Dir holds one, the repository's 1.root.json is trusted as the server gives it: the
	// server is the one the node's mutual TLS trusts (trust on first use).
	Root []byte
}

// maxRootBytes bounds a root fetched for first trust.
const maxRootBytes = 512 << 10

// Fetch verifies b's target and writes its bytes to dst (mode 0755). Nothing is written unless
// every check passed.
func (c *Client) Fetch(ctx context.Context, b Build, dst string) (*metadata.TargetFiles, error) {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, err
	}
	f := &fetcher{ctx: ctx, http: c.HTTP}
	root, err := c.trustedRoot(f)
	if err != nil {
		return nil, err
	}
	cfg, err := config.New(strings.TrimSuffix(c.BaseURL, "/")+MetadataPath, root)
	if err != nil {
		return nil, err
	}
	cfg.LocalMetadataDir = c.Dir
	cfg.LocalTargetsDir = filepath.Join(c.Dir, "targets")
	cfg.RemoteTargetsURL = strings.TrimSuffix(c.BaseURL, "/") + TargetsPath
	cfg.Fetcher = f
	up, err := updater.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: the trusted root: %w", err)
	}
	if err := up.Refresh(); err != nil {
		return nil, fmt.Errorf("tufrepo: the repository's metadata does not verify: %w", err)
	}
	name := TargetName(b.Version, b.OS, b.Arch)
	tf, err := up.GetTargetInfo(name)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: the repository lists no %s: %w", name, err)
	}
	if got, err := BuildOf(name, tf); err != nil {
		return nil, err
	} else if got != b {
		return nil, fmt.Errorf("tufrepo: target %s is signed as %+v, not %+v", name, got, b)
	}
	tmp := dst + ".download"
	defer os.Remove(tmp)
	if _, _, err := up.DownloadTarget(tf, tmp, ""); err != nil {
		return nil, fmt.Errorf("tufrepo: %s does not verify: %w", name, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := syncFile(tmp); err != nil {
		return nil, err
	}
	return tf, os.Rename(tmp, dst)
}

// trustedRoot is the root the updater starts from: the newest one Dir holds, else the pinned
// one, else the server's first.
func (c *Client) trustedRoot(f *fetcher) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, Root+".json"))
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if c.Root != nil {
		return c.Root, nil
	}
	b, err = f.DownloadFile(strings.TrimSuffix(c.BaseURL, "/")+MetadataPath+"1.root.json", maxRootBytes, 0)
	if err != nil {
		return nil, fmt.Errorf("tufrepo: fetch the repository's first root: %w", err)
	}
	return b, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// fetcher is go-tuf's Fetcher over the node's HTTP client, bound to a context.
type fetcher struct {
	ctx  context.Context
	http *http.Client
}

// fetchTimeout bounds one download: a build of 1 GiB over a slow link still fits.
const fetchTimeout = 30 * time.Minute

func (f *fetcher) DownloadFile(url string, maxLength int64, _ time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(f.ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := f.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, &metadata.ErrDownloadHTTP{StatusCode: res.StatusCode, URL: url}
	}
	if res.ContentLength > maxLength {
		return nil, &metadata.ErrDownloadLengthMismatch{Msg: fmt.Sprintf("%s is %d bytes, more than the %d expected", url, res.ContentLength, maxLength)}
	}
	data, err := io.ReadAll(io.LimitReader(res.Body, maxLength+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxLength {
		return nil, &metadata.ErrDownloadLengthMismatch{Msg: fmt.Sprintf("%s is more than the %d bytes expected", url, maxLength)}
	}
	return data, nil
}
