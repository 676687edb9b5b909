package pid1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSystem is a machine for init's tests: it records every call in order and answers from
// its fields. Nothing of the test machine is touched.
type fakeSystem struct {
	mu    sync.Mutex
	calls []string
	files map[string][]byte
	links []Link

	mountErr  map[string]error // by target, once each
	moduleErr map[string]error // by path
	consoleOK bool
	console   *bytes.Buffer
	// dhcp answers a DHCP request on a link; nil: a lease 10.0.2.15/24 at once.
	dhcp      func(ctx context.Context, link string) (Lease, error)
	renew     func(ctx context.Context, l Lease) (Lease, error)
	configErr error
	configs   []Lease
	reaped    int
	noRandom  bool
	linksCall int
	// linksAfter hides the links until Links has been called this many times.
	linksAfter int
	// changed is closed, and replaced, when the machine is called or its console written.
	changed chan struct{}
}

func newFake() *fakeSystem {
	return &fakeSystem{
		files: map[string][]byte{
			"/proc/cmdline":    []byte("console=ttyS0 bcd.site=http://10.0.2.2:8067 panic=-1\n"),
			"/etc/bcd/modules": []byte("# list\n/lib/modules/v/kernel/virtio_ring.ko\n/lib/modules/v/kernel/virtio.ko\n/lib/modules/v/kernel/virtio_net.ko\n"),
		},
		links: []Link{
			{Name: "lo"},
			{Name: "eth1", MAC: "52:54:00:00:00:02", Physical: true},
			{Name: "eth0", MAC: "52:54:00:00:00:01", Physical: true},
			{Name: "br0", MAC: "52:54:00:00:00:03"},
		},
		mountErr:  map[string]error{},
		moduleErr: map[string]error{},
		consoleOK: true,
		console:   &bytes.Buffer{},
		changed:   make(chan struct{}),
	}
}

// record notes a call; f.mu is held.
func (f *fakeSystem) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	f.notify()
}

// notify wakes those awaiting a change; f.mu is held.
func (f *fakeSystem) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// await waits until cond holds, looking again each time init calls the machine or writes its
// console, and fails the test naming what it waited for after 30 s.
func (f *fakeSystem) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		changed := f.changed
		f.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("not within 30s: %s", what)
		}
	}
}

func (f *fakeSystem) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeSystem) Mount(m Mount) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("mount %s %s %s nosuid=%v nodev=%v noexec=%v %s", m.FSType, m.Source, m.Target, m.NoSuid, m.NoDev, m.NoExec, m.Data)
	if err := f.mountErr[m.Target]; err != nil {
		delete(f.mountErr, m.Target)
		return err
	}
	return nil
}

type lockedWriter struct {
	f *fakeSystem
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	defer w.f.notify()
	return w.f.console.Write(p)
}

func (w lockedWriter) Close() error { return nil }

func (f *fakeSystem) OpenConsole() (io.WriteCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("open console")
	if !f.consoleOK {
		return nil, errors.New("no console")
	}
	return lockedWriter{f}, nil
}

func (f *fakeSystem) Console() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.console.String()
}

func (f *fakeSystem) ReadFile(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return b, nil
}

func (f *fakeSystem) WriteFile(name string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("write %s", name)
	f.files[name] = data
	return nil
}

func (f *fakeSystem) File(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return string(f.files[name])
}

func (f *fakeSystem) LoadModule(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("load %s", path[strings.LastIndex(path, "/")+1:])
	return f.moduleErr[path]
}

func (f *fakeSystem) Links() ([]Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.linksCall++
	if f.linksCall <= f.linksAfter {
		return []Link{{Name: "lo"}}, nil
	}
	return append([]Link(nil), f.links...), nil
}

func (f *fakeSystem) LinkUp(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("up %s", name)
	return nil
}

func (f *fakeSystem) DHCP(ctx context.Context, link string) (Lease, error) {
	f.mu.Lock()
	f.record("dhcp %s", link)
	answer := f.dhcp
	f.mu.Unlock()
	if answer == nil {
		return testLease(link, "10.0.2.15/24"), nil
	}
	return answer(ctx, link)
}

func (f *fakeSystem) Renew(ctx context.Context, l Lease) (Lease, error) {
	f.mu.Lock()
	f.record("renew %s %s", l.Link, l.Address)
	answer := f.renew
	f.mu.Unlock()
	if answer == nil {
		return Lease{}, errors.New("no renewals in this test")
	}
	return answer(ctx, l)
}

func (f *fakeSystem) Configure(l Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("configure %s %s via %s", l.Link, l.Address, l.Gateway)
	if f.configErr != nil {
		err := f.configErr
		f.configErr = nil
		return err
	}
	f.configs = append(f.configs, l)
	return nil
}

func (f *fakeSystem) RandomReady() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.noRandom
}

func (f *fakeSystem) Reap() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reaped++
	f.notify()
	return 0
}

func (f *fakeSystem) Reaped() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reaped
}

func testLease(link, addr string) Lease {
	return Lease{Link: link, Address: netip.MustParsePrefix(addr), Gateway: netip.MustParseAddr("10.0.2.2"),
		DNS: []netip.Addr{netip.MustParseAddr("10.0.2.3")}, Search: []string{"lab.example"},
		Server: netip.MustParseAddr("10.0.2.2"), Acquired: time.Now(), Duration: time.Hour}
}

// blockDHCP never answers: it waits for its context, as a NIC on a network without a DHCP
// server does.
func blockDHCP(ctx context.Context, _ string) (Lease, error) {
	<-ctx.Done()
	return Lease{}, ctx.Err()
}
