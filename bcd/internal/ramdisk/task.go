package ramdisk

import (
	"context"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/better-compute/compute/metal/siteapi"
)

// streamAttempts is how many times a deploy downloads its image when the network or the site
// failed (a retry starts over); a wrong image is not downloaded again.
const streamAttempts = 3

// CacheWait is how long a deploy waits for its image to be in the site's cache (the site
// answers 404 until it has fetched and verified it), asking again every PollInterval, before it
// fails.
const CacheWait = 30 * time.Minute

// carryOut does a task and what comes after it, posting its progress: started, the task's
// own phases, boot before a kexec, reboot or power-off, then done, or failed with the error.
func (a *Agent) carryOut(ctx context.Context, task siteapi.Task) {
	machine, _ := a.identity()
	log := a.log.With("task", task.ID, "kind", task.Kind, "then", task.Then)
	report := func(p siteapi.Progress) {
		p.Machine, p.Task = machine, task.ID
		a.out.add(p)
	}
	log.Info("ramdisk: task started")
	report(siteapi.Progress{Phase: siteapi.PhaseStarted})
	err := a.do(ctx, task, report)
	if err == nil {
		err = a.then(ctx, task, report)
	}
	switch {
	case ctx.Err() != nil:
		log.Info("ramdisk: stopped during the task", "err", err)
	case err != nil:
		log.Error("ramdisk: task failed", "err", err)
		report(siteapi.Progress{Phase: siteapi.PhaseFailed, Error: errorText(err)})
	default:
		log.Info("ramdisk: task done")
		report(siteapi.Progress{Phase: siteapi.PhaseDone})
	}
}

// do carries out the task itself.
func (a *Agent) do(ctx context.Context, task siteapi.Task, report func(siteapi.Progress)) error {
	if err := task.Validate(); err != nil {
		return fmt.Errorf("ramdisk: the task is not one this ramdisk can carry out: %w", err)
	}
	switch task.Kind {
	case siteapi.TaskInspect:
		return a.inspectAgain(ctx)
	case siteapi.TaskWipe:
		disks, err := a.disksToWipe(task)
		if err != nil {
			return err
		}
		report(siteapi.Progress{Phase: siteapi.PhaseWipe})
		for _, d := range disks {
			a.log.Info("ramdisk: wiping", "disk", d)
			if err := Wipe(ctx, d); err != nil {
				return err
			}
		}
		return nil
	case siteapi.TaskDeploy:
		return a.deploy(ctx, task, report)
	}
	return fmt.Errorf("ramdisk: task kind %q is not carried out by this ramdisk", task.Kind)
}

// inspectAgain reads the facts afresh and says Hello with them.
func (a *Agent) inspectAgain(ctx context.Context) error {
	in, err := Inspect(a.cfg.Root)
	if err != nil {
		return err
	}
	a.logInspection(in)
	a.mu.Lock()
	a.facts = in.Facts
	a.mu.Unlock()
	return a.hello(ctx)
}

// deploy wipes the disk, streams the image onto it (again, up to streamAttempts, when the
// network or the site failed), and reads it back to verify it. A failure leaves the disk wiped.
func (a *Agent) deploy(ctx context.Context, task siteapi.Task, report func(siteapi.Progress)) error {
	img := *task.Image
	disk, err := a.diskToWrite(task)
	if err != nil {
		return err
	}
	log := a.log.With("task", task.ID, "image", img.ID, "disk", disk)
	if err := checkFormat(img); err != nil { // before the disk is touched
		return err
	}
	report(siteapi.Progress{Phase: siteapi.PhaseWipe})
	log.Info("ramdisk: wiping before the deploy")
	if err := Wipe(ctx, disk); err != nil {
		return err
	}
	src := a.cfg.Site + siteapi.PathImages + img.SHA256
	b := backoff{max: a.cfg.RetryMax}
	asked, waiting := time.Now(), false
	for attempt := 1; ; {
		report(siteapi.Progress{Phase: siteapi.PhaseDownload, Bytes: 0, Total: img.SizeBytes})
		log.Info("ramdisk: streaming the image", "src", src, "bytes", img.SizeBytes, "attempt", attempt)
		_, token := a.identity()
		err = Stream(ctx, a.cfg.Client, src, token, img, disk, func(n int64) {
			report(siteapi.Progress{Phase: siteapi.PhaseDownload, Bytes: n, Total: img.SizeBytes})
		})
		var wait func(context.Context) error
		switch {
		case err == nil || ctx.Err() != nil:
		case isNotCached(err) && time.Since(asked) < CacheWait:
			if !waiting {
				log.Info("ramdisk: the site does not have the image yet; asking again", "every", a.cfg.PollInterval, "for", CacheWait)
				waiting = true
			}
			wait = func(ctx context.Context) error { return sleep(ctx, a.cfg.PollInterval) }
		case isTransient(err) && attempt < streamAttempts:
			log.Warn("ramdisk: the image's download failed; starting over", "err", err)
			attempt++
			wait = b.wait
		}
		if wait == nil || wait(ctx) != nil {
			break
		}
	}
	if err != nil {
		return err
	}
	report(siteapi.Progress{Phase: siteapi.PhaseVerify})
	if err := Verify(ctx, disk, img); err != nil {
		if werr := Wipe(context.WithoutCancel(ctx), disk); werr != nil {
			return fmt.Errorf("%w; and wiping the disk failed too: %v", err, werr)
		}
		return err
	}
	log.Info("ramdisk: image written and verified")
	return nil
}

// taskDisk is the task's disk under Root. It must be a clean path under /dev ("/dev/vda",
// "/dev/disk/by-id/…"): "/dev/../etc/passwd" passes Task.Validate but is no disk.
func (a *Agent) taskDisk(task siteapi.Task) (string, error) {
	if path.Clean(task.Disk) != task.Disk || !strings.HasPrefix(task.Disk, "/dev/") {
		return "", fmt.Errorf("ramdisk: task disk %q is not a clean path under /dev", task.Disk)
	}
	return filepath.Join(a.cfg.Root, task.Disk), nil
}

// diskToWrite is the task's disk under Root, or the largest non-removable disk.
func (a *Agent) diskToWrite(task siteapi.Task) (string, error) {
	if task.Disk != "" {
		return a.taskDisk(task)
	}
	all, err := a.fixedDisks()
	if err != nil {
		return "", err
	}
	best := all[0]
	for _, d := range all[1:] {
		if d.Bytes > best.Bytes {
			best = d
		}
	}
	return filepath.Join(a.cfg.Root, "dev", best.Name), nil
}

// disksToWipe is the task's disk under Root, or every non-removable disk.
func (a *Agent) disksToWipe(task siteapi.Task) ([]string, error) {
	if task.Disk != "" {
		d, err := a.taskDisk(task)
		return []string{d}, err
	}
	all, err := a.fixedDisks()
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, d := range all {
		paths = append(paths, filepath.Join(a.cfg.Root, "dev", d.Name))
	}
	return paths, nil
}

// fixedDisks are the machine's non-removable disks, read now.
func (a *Agent) fixedDisks() ([]disk, error) {
	all, err := disks(a.cfg.Root, &Inspection{})
	if err != nil {
		return nil, fmt.Errorf("ramdisk: listing the disks: %w", err)
	}
	var fixed []disk
	for _, d := range all {
		if !d.Removable {
			fixed = append(fixed, d)
		}
	}
	if len(fixed) == 0 {
		return nil, errors.New("ramdisk: the machine has no non-removable disk, and the task names none")
	}
	return fixed, nil
}

// errorText is an error as Progress carries it: valid UTF-8 without control characters but
// newlines and tabs, at most 2048 bytes.
func errorText(err error) string {
	s := err.Error()
	if len(s) > 2048 {
		s = s[:2048]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
}
