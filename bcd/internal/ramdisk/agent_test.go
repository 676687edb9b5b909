package ramdisk

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
	"github.com/google/go-cmp/cmp"
)

// power records the injected kexec, reboot and power-off: the tests never do the real ones.
type power struct {
	mu       sync.Mutex
	kexecs   []kexecCall
	reboots  int
	poweroff int
	err      error  // what each returns
	before   func() // called first, to look at the site at that moment
}

type kexecCall struct {
	kernel, initrd []byte
	cmdline        string
}

func (p *power) inject(cfg *Config) {
	cfg.Kexec = func(kernel, initrd, cmdline string) error {
		if p.before != nil {
			p.before()
		}
		k, err := os.ReadFile(kernel)
		if err != nil {
			return err
		}
		var i []byte
		if initrd != "" {
			if i, err = os.ReadFile(initrd); err != nil {
				return err
			}
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.kexecs = append(p.kexecs, kexecCall{k, i, cmdline})
		return p.err
	}
	cfg.Reboot = func() error {
		if p.before != nil {
			p.before()
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.reboots++
		return p.err
	}
	cfg.PowerOff = func() error {
		if p.before != nil {
			p.before()
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.poweroff++
		return p.err
	}
}

// start runs an Agent against site on the fake machine at root until the test ends; its
// kexec, reboot and power-off are p's.
func start(t *testing.T, site *fakeSite, root, machine, token string, p *power) {
	t.Helper()
	cfg := Config{
		Site: site.URL, Machine: machine, Token: token, Root: root,
		PollInterval: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	p.inject(&cfg)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return 10 s after its context was cancelled")
		}
	})
}

func TestRunUnknownMachineSaysHelloUntilKnown(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	site.set(func(s *fakeSite) { s.failHellos, s.unknownHellos, s.failTasks = 2, 4, 2 })
	root := tree(t, server())
	start(t, site, root, "", "t-1", &power{})

	site.waitFor(t, "a task request with the token", func(s *fakeSite) bool {
		return len(s.taskGets) > 0 && s.taskGets[len(s.taskGets)-1].status == 204
	})
	want, err := Inspect(root)
	if err != nil {
		t.Fatal(err)
	}
	site.set(func(s *fakeSite) {
		if len(s.hellos) != 5 {
			t.Errorf("%d Hellos, want 5: 2 answered 503, 2 more as unknown, then one known", len(s.hellos))
		}
		for i, h := range s.hellos {
			if h.Machine != "" || s.helloAuths[i] != "Bearer t-1" {
				t.Errorf("Hello %d names machine %q, with %q: an unknown machine names none, with its boot's token", i, h.Machine, s.helloAuths[i])
			}
			if d := cmp.Diff(want.Facts, h.Facts); d != "" {
				t.Errorf("Hello %d facts (-inspected +sent):\n%s", i, d)
			}
		}
		for i, r := range s.taskGets {
			if r.machine != "m-1" || r.auth != "Bearer t-1" {
				t.Errorf("task request %d for machine %q with %q; want m-1 with Bearer t-1", i, r.machine, r.auth)
			}
		}
		if s.taskGets[0].status != 503 || s.taskGets[1].status != 503 {
			t.Errorf("the first task requests were answered %d and %d; the test wanted 503s, retried", s.taskGets[0].status, s.taskGets[1].status)
		}
	})
}

// deployTask is a deploy of img to /dev/vda, then a kexec of the site's kernel and initrd.
func deployTask(id string, img siteapi.Image, kernelURL string) *siteapi.Task {
	return &siteapi.Task{
		ID: id, Kind: siteapi.TaskDeploy, Image: &img, Disk: "/dev/vda", Then: siteapi.ThenKexec,
		Kernel: kernelURL, Initrd: "/boot/deployed/initrd", // an absolute URL, and a path on the site
		Cmdline: `bcd.hostname=m-1 root=/dev/vda1 console="ttyS0`, // an image's unbalanced quote
	}
}

func TestRunDeploysThenKexecs(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	img, desc := testImage(t, 5<<20+123)
	kernel, initrd := []byte("the deployed kernel"), []byte("the deployed initramfs")
	task := deployTask("task-1", desc, site.URL+"/boot/deployed/vmlinuz")
	site.set(func(s *fakeSite) {
		s.files[siteapi.PathImages+desc.SHA256] = img
		s.files["/boot/deployed/vmlinuz"], s.files["/boot/deployed/initrd"] = kernel, initrd
		s.task = task
		s.credential = "jt-123"
		s.failProgress = 3 // posts that fail are retried, not dropped
	})
	root := tree(t, server())
	vda := filepath.Join(root, "dev/vda")
	if err := os.WriteFile(vda, bytes.Repeat([]byte{0xAA}, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var bootPosted bool
	p := &power{}
	p.before = func() {
		site.mu.Lock()
		defer site.mu.Unlock()
		bootPosted = site.count("task-1", siteapi.PhaseBoot) == 1
	}
	start(t, site, root, "m-1", "t-1", p)
	site.waitFor(t, "the deploy to finish", func(s *fakeSite) bool { return s.finished("task-1") })

	site.set(func(s *fakeSite) {
		want := []string{"started", "wipe", "download", "verify", "boot", "done"}
		if got := s.phases("task-1"); !cmp.Equal(got, want) {
			t.Errorf("phases %q, want %q (last: %+v)", joined(got), joined(want), s.last("task-1"))
		}
		var last int64 = -1
		for _, pr := range s.progress {
			if pr.Machine != "m-1" {
				t.Errorf("progress for machine %q, want m-1", pr.Machine)
			}
			if pr.Phase != siteapi.PhaseDownload {
				continue
			}
			if pr.Total != desc.SizeBytes || pr.Bytes < last {
				t.Errorf("download progress %d/%d after %d: want rising bytes of %d", pr.Bytes, pr.Total, last, desc.SizeBytes)
			}
			last = pr.Bytes
		}
		if last != desc.SizeBytes {
			t.Errorf("the last download progress says %d bytes, want %d", last, desc.SizeBytes)
		}
		if s.gets[siteapi.PathImages+desc.SHA256] != 1 {
			t.Errorf("the image was fetched %d times, want once", s.gets[siteapi.PathImages+desc.SHA256])
		}
	})
	if got := readAll(t, vda); !bytes.Equal(got[:len(img)], img) {
		t.Error("/dev/vda does not hold the image")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// The join credential the site handed over, added where the kernel reads it.
	want := []kexecCall{{kernel, initrd, `bcd.join=jt-123 bcd.hostname=m-1 root=/dev/vda1 console="ttyS0`}}
	if d := cmp.Diff(want, p.kexecs, cmp.AllowUnexported(kexecCall{})); d != "" {
		t.Errorf("kexec calls (-want +got):\n%s", d)
	}
	site.mu.Lock()
	defer site.mu.Unlock()
	if want := []siteapi.CredentialRequest{{Machine: "m-1", Task: "task-1"}}; !cmp.Equal(want, site.credentials) {
		t.Errorf("credentials asked for: %+v, want %+v", site.credentials, want)
	}
	if !bootPosted {
		t.Error("kexec was called before the site had PhaseBoot")
	}
	if p.reboots != 0 || p.poweroff != 0 {
		t.Errorf("%d reboots and %d power-offs; the task said kexec", p.reboots, p.poweroff)
	}
}

// TestRunSaysHelloAgainWhenRefused: the site refusing a task request (the boot's machine is
// another now) is asked who the machine is, and the task asked for as that machine.
func TestRunSaysHelloAgainWhenRefused(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	start(t, site, tree(t, server()), "m-1", "t-1", &power{})
	site.waitFor(t, "a task request", func(s *fakeSite) bool { return len(s.taskGets) > 0 })
	var asked int
	site.set(func(s *fakeSite) {
		asked = len(s.taskGets)
		s.machine = "m-2" // the machine was enrolled again, under another id
		s.task = &siteapi.Task{ID: "task-1", Kind: siteapi.TaskWipe, Disk: "/dev/vda", Then: siteapi.ThenWait}
	})
	site.waitFor(t, "the wipe to finish", func(s *fakeSite) bool { return s.finished("task-1") })

	site.set(func(s *fakeSite) {
		if r := s.taskGets[asked]; r.machine != "m-1" || r.status != 403 {
			t.Errorf("task request after the change %+v, want m-1 refused", r)
		}
		if len(s.hellos) != 2 || s.hellos[1].Machine != "m-1" || s.helloAuths[1] != "Bearer t-1" {
			t.Errorf("hellos %+v: want a second Hello, from m-1 with its boot's token, after the 403", s.hellos)
		}
		if r := s.taskGets[asked+1]; r.machine != "m-2" || r.status != 200 {
			t.Errorf("the next task request %+v, want m-2's taken", r)
		}
		if got, want := s.phases("task-1"), []string{"started", "wipe", "done"}; !cmp.Equal(got, want) {
			t.Errorf("phases %q, want %q", joined(got), joined(want))
		}
	})
}

// TestRunPostsProgressAfterARefusal: progress the site refuses (403) is posted again after a
// Hello, not dropped.
func TestRunPostsProgressAfterARefusal(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	site.set(func(s *fakeSite) {
		s.task = &siteapi.Task{ID: "task-1", Kind: siteapi.TaskWipe, Disk: "/dev/vda", Then: siteapi.ThenReboot}
		s.refuseProgress = 2
	})
	start(t, site, tree(t, server()), "m-1", "t-1", &power{})
	site.waitFor(t, "PhaseDone, posted after the refusals", func(s *fakeSite) bool { return s.finished("task-1") })
	site.set(func(s *fakeSite) {
		if got, want := s.phases("task-1"), []string{"started", "wipe", "boot", "done"}; !cmp.Equal(got, want) || len(s.hellos) < 2 {
			t.Errorf("phases %q and %d hellos, want %q after a second Hello", joined(got), len(s.hellos), joined(want))
		}
	})
}

// TestRunFailsAKexecWithoutItsCredential: a join credential the site will not hand over (410:
// another boot of the machine had it) fails the task before the kexec, saying why.
func TestRunFailsAKexecWithoutItsCredential(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	site.set(func(s *fakeSite) {
		s.files["/k"] = []byte("k")
		s.task = &siteapi.Task{ID: "task-1", Kind: siteapi.TaskInspect, Then: siteapi.ThenKexec, Kernel: "/k", Cmdline: "root=/dev/vda"}
		s.credentialCode = http.StatusGone
	})
	p := &power{}
	start(t, site, tree(t, server()), "m-1", "t-1", p)
	site.waitFor(t, "the task to fail", func(s *fakeSite) bool { return s.finished("task-1") })
	site.set(func(s *fakeSite) {
		if last := s.last("task-1"); last.Phase != siteapi.PhaseFailed || !strings.Contains(last.Error, "refused the join credential of task task-1: 410") {
			t.Errorf("last progress %+v, want failed saying the credential was refused", last)
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.kexecs) != 0 {
		t.Error("a kexec without the join credential")
	}
}

func TestRunCarriesOutATaskOnce(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	site.set(func(s *fakeSite) {
		s.task = &siteapi.Task{ID: "task-1", Kind: siteapi.TaskWipe, Then: siteapi.ThenWait} // every fixed disk
	})
	root := tree(t, server())
	vda := filepath.Join(root, "dev/vda")
	if err := os.WriteFile(vda, bytes.Repeat([]byte{0xAA}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, site, root, "m-1", "t-1", &power{})
	site.waitFor(t, "the wipe to finish", func(s *fakeSite) bool { return s.finished("task-1") })
	checkWiped(t, readAll(t, vda))
	if err := os.WriteFile(vda, bytes.Repeat([]byte{0xAA}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var after int
	site.set(func(s *fakeSite) { after = len(s.taskGets) })
	site.waitFor(t, "five more task requests", func(s *fakeSite) bool { return len(s.taskGets) >= after+5 })
	site.set(func(s *fakeSite) {
		if n := s.count("task-1", siteapi.PhaseStarted); n != 1 {
			t.Errorf("task-1 started %d times, want once", n)
		}
	})
	if b := readAll(t, vda); b[0] != 0xAA {
		t.Error("the disk was wiped again: the task was carried out twice")
	}
}

func TestRunReportsAFailedImage(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	img, desc := testImage(t, 3<<20)
	bad := bytes.Clone(img)
	bad[1<<20] ^= 1
	site.set(func(s *fakeSite) {
		s.files[siteapi.PathImages+desc.SHA256] = bad
		s.files["/boot/k"] = []byte("k")
		s.task = deployTask("task-1", desc, site.URL+"/boot/k")
	})
	root := tree(t, server())
	vda := filepath.Join(root, "dev/vda")
	if err := os.WriteFile(vda, bytes.Repeat([]byte{0xAA}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &power{}
	start(t, site, root, "m-1", "t-1", p)
	site.waitFor(t, "the deploy to finish", func(s *fakeSite) bool { return s.finished("task-1") })

	site.set(func(s *fakeSite) {
		if got, want := s.phases("task-1"), []string{"started", "wipe", "download", "failed"}; !cmp.Equal(got, want) {
			t.Errorf("phases %q, want %q", joined(got), joined(want))
		}
		if last := s.last("task-1"); !strings.Contains(last.Error, "SHA-256") || !strings.Contains(last.Error, desc.SHA256) {
			t.Errorf("failed with %q, want an error naming the digests", last.Error)
		}
		if n := s.gets[siteapi.PathImages+desc.SHA256]; n != 1 {
			t.Errorf("a wrong image was fetched %d times; a retry would fetch the same bytes", n)
		}
	})
	checkWiped(t, readAll(t, vda))
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.kexecs) != 0 {
		t.Error("kexec after a failed deploy")
	}
}

func TestRunRetriesAnImageNotCachedYet(t *testing.T) {
	t.Parallel()
	site := newFakeSite(t)
	img, desc := testImage(t, 1<<20)
	site.set(func(s *fakeSite) {
		s.task = deployTask("task-1", desc, "/boot/k")
		s.task.Then = siteapi.ThenWait
	})
	start(t, site, tree(t, server()), "m-1", "t-1", &power{})
	site.waitFor(t, "a first GET of the image", func(s *fakeSite) bool { return s.gets[siteapi.PathImages+desc.SHA256] > 0 })
	site.set(func(s *fakeSite) { s.files[siteapi.PathImages+desc.SHA256] = img }) // now cached
	site.waitFor(t, "the deploy to finish", func(s *fakeSite) bool { return s.finished("task-1") })
	site.set(func(s *fakeSite) {
		if last := s.last("task-1"); last.Phase != siteapi.PhaseDone {
			t.Errorf("last progress %+v, want done once the site had the image", last)
		}
	})
}

func TestRunRefusesATaskItCannotDo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		task    siteapi.Task
		wantErr string
	}{
		{"qcow2", siteapi.Task{ID: "t", Kind: siteapi.TaskDeploy, Disk: "/dev/vda", Then: siteapi.ThenWait,
			Image: &siteapi.Image{ID: "i", URL: "http://x/i.qcow2", Format: "qcow2", SizeBytes: 1, SHA256: strings.Repeat("a", 64)}},
			"only raw images are streamed"},
		{"unknown kind", siteapi.Task{ID: "t", Kind: "firmware", Then: siteapi.ThenWait}, `"firmware" is not a task kind`},
		{"no disk", siteapi.Task{ID: "t", Kind: siteapi.TaskWipe, Disk: "/dev/nvme9n1", Then: siteapi.ThenWait}, "nvme9n1"},
		{"a path out of /dev", siteapi.Task{ID: "t", Kind: siteapi.TaskWipe, Disk: "/dev/../dev/vda", Then: siteapi.ThenWait}, "not a clean path under /dev"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			site := newFakeSite(t)
			site.set(func(s *fakeSite) { s.task = &c.task })
			root := tree(t, server())
			vda := filepath.Join(root, "dev/vda")
			if err := os.WriteFile(vda, bytes.Repeat([]byte{0xAA}, 2<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			start(t, site, root, "m-1", "t-1", &power{})
			site.waitFor(t, "the task to finish", func(s *fakeSite) bool { return s.finished("t") })
			site.set(func(s *fakeSite) {
				if last := s.last("t"); last.Phase != siteapi.PhaseFailed || !strings.Contains(last.Error, c.wantErr) {
					t.Errorf("last progress %+v, want failed saying %q", last, c.wantErr)
				}
			})
			if b := readAll(t, vda); b[0] != 0xAA {
				t.Error("a refused task changed the disk")
			}
		})
	}
}

func TestRunThen(t *testing.T) {
	t.Parallel()
	for _, then := range []string{siteapi.ThenReboot, siteapi.ThenPowerOff} {
		t.Run(then, func(t *testing.T) {
			site := newFakeSite(t)
			site.set(func(s *fakeSite) {
				s.task = &siteapi.Task{ID: "task-1", Kind: siteapi.TaskInspect, Then: then}
			})
			var bootPosted bool
			p := &power{err: errors.New("the test's " + then + " refused")}
			p.before = func() {
				site.mu.Lock()
				defer site.mu.Unlock()
				bootPosted = site.count("task-1", siteapi.PhaseBoot) == 1
			}
			start(t, site, tree(t, server()), "m-1", "t-1", p)
			site.waitFor(t, "the task to finish", func(s *fakeSite) bool { return s.finished("task-1") })
			site.set(func(s *fakeSite) {
				if got, want := s.phases("task-1"), []string{"started", "boot", "failed"}; !cmp.Equal(got, want) {
					t.Errorf("phases %q, want %q", joined(got), joined(want))
				}
				if last := s.last("task-1"); !strings.Contains(last.Error, "refused") {
					t.Errorf("failed with %q, want the %s's error", last.Error, then)
				}
				if len(s.hellos) != 2 {
					t.Errorf("%d Hellos; an inspect task says Hello again", len(s.hellos))
				}
			})
			p.mu.Lock()
			defer p.mu.Unlock()
			if got := map[string]int{siteapi.ThenReboot: p.reboots, siteapi.ThenPowerOff: p.poweroff}; got[then] != 1 || len(p.kexecs) != 0 {
				t.Errorf("reboots %d, power-offs %d, kexecs %d; want one %s", p.reboots, p.poweroff, len(p.kexecs), then)
			}
			if !bootPosted {
				t.Errorf("%s before the site had PhaseBoot", then)
			}
		})
	}
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	cases := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no site", Config{}, "Config.Site is required"},
		{"site not http", Config{Site: "tftp://10.0.0.1"}, "Config.Site"},
		{"no token", Config{Site: "http://h", Machine: "m-1"}, "Config.Token is required"},
		{"root missing", Config{Site: "http://h", Token: "t", Root: filepath.Join(root, "absent")}, "Config.Root"},
		{"negative poll", Config{Site: "http://h", Token: "t", PollInterval: -1}, "Config.PollInterval"},
		{"negative retry", Config{Site: "http://h", Token: "t", RetryMax: -1}, "Config.RetryMax"},
	}
	for _, c := range cases {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: err = %v, want one naming %s", c.name, err, c.wantErr)
		}
	}
	cfg := Config{Site: "http://10.0.0.1:8067/", Token: "t"}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.cfg.Site != "http://10.0.0.1:8067" || a.cfg.Root != RootDefault || a.cfg.PollInterval != PollIntervalDefault ||
		a.cfg.RetryMax != RetryMaxDefault || a.cfg.Client == nil || a.cfg.Logger == nil ||
		a.cfg.Kexec == nil || a.cfg.Reboot == nil || a.cfg.PowerOff == nil { // filled, never called here
		t.Errorf("defaults not filled: %+v", a.cfg)
	}
	if cfg.Root != "" || cfg.Site != "http://10.0.0.1:8067/" {
		t.Error("New changed the caller's Config")
	}
}
