package ramdisk

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/better-compute/compute/metal/siteapi"
)

// maxBootFile is the largest kernel or initramfs the ramdisk downloads (into memory: its
// temporary directory is a tmpfs).
const maxBootFile = 2 << 30

// then does what the task says comes after it. Before a kexec, reboot or power-off it posts
// PhaseBoot and waits until all progress has been posted: nothing is left unsaid.
func (a *Agent) then(ctx context.Context, task siteapi.Task, report func(siteapi.Progress)) error {
	var act func() error
	switch task.Then {
	case siteapi.ThenWait:
		return nil
	case siteapi.ThenReboot:
		act = a.cfg.Reboot
	case siteapi.ThenPowerOff:
		act = a.cfg.PowerOff
	case siteapi.ThenKexec:
		dir, err := os.MkdirTemp("", "bcd-kexec-")
		if err != nil {
			return fmt.Errorf("ramdisk: kexec: %w", err)
		}
		defer os.RemoveAll(dir)
		kernel, err := a.download(ctx, task.Kernel, filepath.Join(dir, "kernel"))
		if err != nil {
			return err
		}
		var initrd string
		if task.Initrd != "" {
			if initrd, err = a.download(ctx, task.Initrd, filepath.Join(dir, "initrd")); err != nil {
				return err
			}
		}
		cmdline, err := a.withJoinCredential(ctx, task)
		if err != nil {
			return err
		}
		act = func() error { return a.cfg.Kexec(kernel, initrd, cmdline) }
	default:
		return fmt.Errorf("ramdisk: then %q is not something this ramdisk does", task.Then)
	}
	report(siteapi.Progress{Phase: siteapi.PhaseBoot})
	if err := a.out.flush(ctx); err != nil {
		return err
	}
	a.log.Info("ramdisk: "+task.Then, "task", task.ID)
	if err := act(); err != nil {
		return fmt.Errorf("ramdisk: %s: %w", task.Then, err)
	}
	return nil
}

// download fetches an http URL (or a path on the site) to a file, trying again up to
// streamAttempts when the network or the site fails, and returns the file's path.
func (a *Agent) download(ctx context.Context, ref, path string) (string, error) {
	u, err := a.resolve(ref)
	if err != nil {
		return "", err
	}
	b := backoff{max: a.cfg.RetryMax}
	for attempt := 1; ; attempt++ {
		err = a.downloadOnce(ctx, u, path)
		if err == nil || !isTransient(err) || attempt == streamAttempts || ctx.Err() != nil {
			return path, err
		}
		a.log.Warn("ramdisk: download failed; trying again", "url", u, "err", err)
		if b.wait(ctx) != nil {
			return path, err
		}
	}
}

func (a *Agent) downloadOnce(ctx context.Context, u, path string) error {
	resp, body, err := get(ctx, a.cfg.Client, u, "", StallTimeout) // no token: the kernel is the image's, anywhere
	if err != nil {
		return fmt.Errorf("ramdisk: download: %w", err)
	}
	defer body.Close()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("ramdisk: download %s: %w", u, err)
	}
	n, err := io.Copy(f, io.LimitReader(body, maxBootFile+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return transient(fmt.Errorf("ramdisk: download %s: after %d bytes: %w", u, n, err))
	case n > maxBootFile:
		return fmt.Errorf("ramdisk: download %s: larger than %d bytes: not a kernel or an initramfs", u, maxBootFile)
	case resp.ContentLength >= 0 && n != resp.ContentLength:
		return transient(fmt.Errorf("ramdisk: download %s: %d of %d bytes", u, n, resp.ContentLength))
	}
	return nil
}

// resolve makes a task's kernel or initrd reference an absolute URL: an http(s) URL as it is,
// a path relative to the site.
func (a *Agent) resolve(ref string) (string, error) {
	base, err := url.Parse(a.cfg.Site + "/")
	if err != nil {
		return "", err
	}
	u, err := base.Parse(ref)
	if err != nil {
		return "", fmt.Errorf("ramdisk: %q is not a URL: %w", ref, err)
	}
	if !strings.HasPrefix(u.Scheme, "http") {
		return "", fmt.Errorf("ramdisk: %q is not an http URL", ref)
	}
	return u.String(), nil
}
