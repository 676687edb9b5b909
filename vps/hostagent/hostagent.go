// Package hostagent is the vps module's node side: in bcd node on a VM host, it converges the
// desired-state part vps.instances through a hypervisor runtime (vps/runtime), fetches and checks
// the images instances boot, serves their serial consoles to access.console, and reports what it
// found (vps.host when it starts and whenever its runtime stops or starts answering,
// vps.instance_status after each change and periodically).
//
//	a, _ := hostagent.New(hostagent.Options{Runtime: rt, Dir: "/var/lib/bcd/vps", Reporter: reports})
//	go a.Run(ctx)
//	daemon.Config{Extensions: []ext.Extension{a.Extension()}, Reports: reports}
package hostagent

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/vps/hostapi"
	"github.com/better-compute/compute/vps/hostnet"
	"github.com/better-compute/compute/vps/runtime"
)

// DefaultMaxImageBytes is Options.MaxImageBytes's default: 100 GiB.
const DefaultMaxImageBytes = 100 << 30

// Options configure a host agent. Zero values mean the defaults.
type Options struct {
	// Runtime drives the host's hypervisor. Required.
	Runtime runtime.Runtime
	// Dir keeps the image cache (cache/), the consoles' sockets (consoles/) and what the agent
	// remembers between restarts (state.json). Required. The hypervisor's user must be able to
	// read the cache and reach the consoles' directory: Dir is made 0755.
	Dir string
	// Reporter sends the agent's reports up the node's session (nodeagent.Reports). Required.
	Reporter ext.Reporter
	// HTTP fetches images; default a client with a 10-minute timeout.
	HTTP *http.Client
	// MaxImageBytes bounds an image (a kernel, an initramfs, a disk) fetched for a tenant: its
	// URL could serve bytes without end and fill the host's disk before the checksum is known.
	// Default DefaultMaxImageBytes.
	MaxImageBytes int64
	// QemuImg checks qcow2 images before they are kept (runtime.CheckImage): a path or a name
	// on PATH; default "qemu-img".
	QemuImg string
	// StatusEvery is how often the instances' status is reported when nothing changed; default
	// 30 s.
	StatusEvery time.Duration
	// RetryEvery is how often a runtime that did not answer is tried again, so that the host is
	// a place for VMs again soon after it answers; default 5 s.
	RetryEvery time.Duration
	// Links, if set, makes the bridges (and VLAN sub-interfaces of Uplink) instances' NICs plug
	// into (hostnet.Links, as root); without it NICs plug into bridges that exist.
	Links interface{ Ensure(hostnet.Segment) error }
	// Uplink is the host's interface that carries the networks' VLANs (bcd node --vps-uplink).
	Uplink string
	// GPUs, if set, reads the host's GPUs: UUID → PCI address, which the runtime passes through.
	// Without it an instance holding GPUs is refused (reported in error).
	GPUs   func(ctx context.Context) (map[string]string, error)
	Logger *slog.Logger
}

// Agent is one host's agent. Its converger and its reporting loop (Run) share what it last
// found.
type Agent struct {
	opts  Options
	cache *cache
	dirty chan struct{} // the status changed: report it

	mu         sync.Mutex // one convergence at a time; guards what follows
	state      persisted
	errored    map[string]string            // instances that could not be made as asked, and why
	snapErrors map[string]map[string]string // instance → snapshot → why it could not be saved or restored
	watches    map[string]*readyWatch       // warm instances whose console is watched for their ready line
	ready      map[string]bool              // those whose guest printed it
	sshPorts   map[string]*sshPort          // sandboxes' second serial ports, served by the agent (sshport.go)
}

// persisted is what the agent keeps across restarts: the reboots and restores it has done per
// instance, so that a restart neither does one again nor forgets one it owes.
type persisted struct {
	Reboots  map[string]int `json:"reboots"`
	Restores map[string]int `json:"restores,omitempty"`
}

// New checks opts and reads what the agent kept.
func New(opts Options) (*Agent, error) {
	switch {
	case opts.Runtime == nil:
		return nil, errors.New("hostagent: a runtime is required")
	case opts.Dir == "":
		return nil, errors.New("hostagent: a directory is required")
	case opts.Reporter == nil:
		return nil, errors.New("hostagent: a reporter is required")
	}
	opts.HTTP = cmp.Or(opts.HTTP, &http.Client{Timeout: 10 * time.Minute})
	opts.QemuImg = cmp.Or(opts.QemuImg, "qemu-img")
	opts.StatusEvery = cmp.Or(opts.StatusEvery, 30*time.Second)
	opts.RetryEvery = cmp.Or(opts.RetryEvery, 5*time.Second)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	if opts.MaxImageBytes < 0 {
		return nil, fmt.Errorf("hostagent: Options.MaxImageBytes must not be negative, got %d", opts.MaxImageBytes)
	}
	opts.MaxImageBytes = cmp.Or(opts.MaxImageBytes, DefaultMaxImageBytes)
	for _, d := range []string{opts.Dir, filepath.Join(opts.Dir, "cache"), filepath.Join(opts.Dir, "consoles"), filepath.Join(opts.Dir, "snapshots")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("hostagent: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("hostagent: %w", err)
		}
	}
	a := &Agent{opts: opts, cache: &cache{dir: filepath.Join(opts.Dir, "cache"), http: opts.HTTP, qemuImg: opts.QemuImg, maxBytes: opts.MaxImageBytes},
		dirty: make(chan struct{}, 1), state: persisted{Reboots: map[string]int{}, Restores: map[string]int{}},
		errored: map[string]string{}, snapErrors: map[string]map[string]string{}, watches: map[string]*readyWatch{}, ready: map[string]bool{},
		sshPorts: map[string]*sshPort{}}
	b, err := os.ReadFile(a.statePath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("hostagent: %w", err)
	default:
		if err := json.Unmarshal(b, &a.state); err != nil {
			return nil, fmt.Errorf("hostagent: %s is damaged: %w", a.statePath(), err)
		}
		if a.state.Reboots == nil {
			a.state.Reboots = map[string]int{}
		}
		if a.state.Restores == nil {
			a.state.Restores = map[string]int{}
		}
	}
	return a, nil
}

func (a *Agent) statePath() string { return filepath.Join(a.opts.Dir, "state.json") }

// consolePath is where an instance's serial console is served. Short, as a Unix socket's path
// must be (108 bytes).
func (a *Agent) consolePath(id string) string {
	return filepath.Join(a.opts.Dir, "consoles", id+".sock")
}

// agentPath is where an instance's second serial port is served.
func (a *Agent) agentPath(id string) string {
	return filepath.Join(a.opts.Dir, "consoles", id+".agent")
}

// snapshotPath is where a snapshot of an instance is saved (its memory; its disk beside it, in
// <path>.disk).
func (a *Agent) snapshotPath(instance, snapshot string) string {
	return filepath.Join(a.opts.Dir, "snapshots", instance, snapshot)
}

// snapshotsOf lists the snapshots the host keeps of an instance.
func (a *Agent) snapshotsOf(instance string) []string {
	entries, _ := os.ReadDir(filepath.Join(a.opts.Dir, "snapshots", instance))
	var out []string
	for _, e := range entries {
		if n := e.Name(); validID(n) {
			out = append(out, n)
		}
	}
	return out
}

// Extension is the agent's part of bcd node: the converger of vps.instances and the instances'
// consoles.
func (a *Agent) Extension() ext.Extension {
	c := &consoles{a: a} // console.go: each instance's console for its own reservation alone
	return ext.Extension{
		Name:    "vps",
		Desired: map[string]ext.Converger{hostapi.KindInstances: c.converge},
		Console: c.console,
	}
}

// validID keeps an instance id from naming a path outside the agent's directories.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// converge makes the host run what payload says, and nothing else the runtime made. An instance
// that cannot be made (an image that does not match its checksum, a runtime's refusal) is
// reported as in error and does not stop the others; only a runtime that cannot list its
// instances fails the convergence, which the node then reports as not applied.
func (a *Agent) converge(ctx context.Context, version uint32, payload []byte) error {
	var want hostapi.Instances
	if payload != nil {
		if version != hostapi.InstancesVersion {
			return fmt.Errorf("hostagent: vps.instances version %d is not known here (this bcd knows %d)", version, hostapi.InstancesVersion)
		}
		if err := json.Unmarshal(payload, &want); err != nil {
			return fmt.Errorf("hostagent: vps.instances: %w", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.markDirty()
	began := time.Now()
	defer func() {
		a.opts.Logger.Debug("vps: converged", "instances", len(want.Instances), "took", time.Since(began))
	}()
	have, err := a.opts.Runtime.List(ctx)
	if err != nil {
		return fmt.Errorf("hostagent: list the runtime's instances: %w", err)
	}
	// A new instance owes no reboots and no restores: those asked before the host knew it were
	// its birth's.
	fresh := false
	for _, in := range want.Instances {
		if _, ok := a.state.Reboots[in.ID]; !ok && validID(in.ID) {
			a.state.Reboots[in.ID] = in.Reboots
			if in.Restore != nil {
				a.state.Restores[in.ID] = in.Restore.Serial
			}
			fresh = true
		}
	}
	if fresh {
		if err := a.save(); err != nil {
			return err
		}
	}
	wanted := map[string]bool{}
	errored := map[string]string{}
	for _, in := range want.Instances {
		if !validID(in.ID) {
			a.opts.Logger.Warn("vps: an instance id this host will not use", "id", in.ID)
			continue
		}
		wanted[in.ID] = true
		if err := a.ensure(ctx, in); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			a.opts.Logger.Warn("vps: instance not made as asked", "instance", in.ID, "err", err)
			errored[in.ID] = err.Error()
		}
	}
	a.errored = errored
	readyLines := map[string]string{}
	for _, in := range want.Instances {
		if in.ReadyLine != "" && wanted[in.ID] && errored[in.ID] == "" {
			readyLines[in.ID] = in.ReadyLine
		}
	}
	a.watchReady(readyLines)
	ports := map[string][]byte{}
	for _, in := range want.Instances {
		if in.Agent && wanted[in.ID] {
			ports[in.ID] = in.SSHRevoked
		}
	}
	a.serveSSHPorts(ports)
	for _, st := range have {
		if wanted[st.ID] {
			continue
		}
		if err := a.opts.Runtime.Delete(ctx, st.ID); err != nil {
			return fmt.Errorf("hostagent: delete instance %s: %w", st.ID, err)
		}
		_ = os.Remove(a.consolePath(st.ID))
		_ = os.Remove(a.agentPath(st.ID))
		_ = os.Remove(a.guestPortPath(st.ID))
		_ = os.RemoveAll(filepath.Join(a.opts.Dir, "snapshots", st.ID))
		_ = os.Remove(a.seedPath(st.ID))
		_ = os.Remove(a.seedPath(st.ID) + ".sha256")
		a.opts.Logger.Info("vps: instance deleted", "instance", st.ID)
	}
	for id := range a.snapErrors {
		if !wanted[id] {
			delete(a.snapErrors, id)
		}
	}
	changed := false
	for _, counts := range []map[string]int{a.state.Reboots, a.state.Restores} {
		for id := range counts {
			if !wanted[id] {
				delete(counts, id)
				changed = true
			}
		}
	}
	if changed {
		return a.save()
	}
	return nil
}

// ensure makes one instance exist in its power state, and reboots it when it was asked to
// reboot more times than the host has.
func (a *Agent) ensure(ctx context.Context, in hostapi.Instance) error {
	r := runtime.Instance{ID: in.ID, VCPUs: in.VCPUs, MemoryMiB: in.MemoryMiB, DiskGiB: in.DiskGiB, Cmdline: in.Cmdline, Power: in.Power,
		Console: a.consolePath(in.ID), GPUs: in.GPUs}
	if in.Agent {
		r.Agent = a.guestPortPath(in.ID) // the agent serves agentPath (sshport.go)
	}
	for _, f := range []struct {
		art    *hostapi.Artifact
		dst    *string
		format *string
	}{{in.Kernel, &r.Kernel, nil}, {in.Initrd, &r.Initrd, nil}, {in.Disk, &r.Disk, &r.DiskFormat}} {
		if f.art == nil {
			continue
		}
		p, format, err := a.cache.get(ctx, scope(in), *f.art)
		if err != nil {
			return err
		}
		*f.dst = p
		if f.format != nil {
			*f.format = format
		}
	}
	if len(in.GPUs) > 0 {
		gpus, err := a.passThrough(ctx, in.GPUs)
		if err != nil {
			return err
		}
		r.GPUs = gpus
	}
	for _, n := range in.NICs {
		if a.opts.Links != nil {
			if err := a.opts.Links.Ensure(hostnet.Segment{Bridge: n.Bridge, VLAN: n.VLAN, Uplink: a.opts.Uplink}); err != nil {
				return fmt.Errorf("network %s: %w", n.Network, err)
			}
		}
		// Untagged on the bridge: the bridge's port on the uplink's VLAN sub-interface tags.
		r.NICs = append(r.NICs, runtime.NIC{MAC: n.MAC, Bridge: n.Bridge})
	}
	if in.CloudInit != nil {
		p, err := a.writeSeed(in.ID, in.CloudInit)
		if err != nil {
			return err
		}
		r.Seed = p
	}
	if len(in.Env) > 0 && r.Kernel != "" {
		b, _ := json.Marshal(in.Env)
		r.Cmdline = strings.TrimSpace(r.Cmdline + " bc.env=" + base64.RawURLEncoding.EncodeToString(b))
	}
	st, err := a.opts.Runtime.Ensure(ctx, r)
	if err != nil {
		return err
	}
	// The hypervisor makes the console and the second port with its own umask: whoever
	// connects has the guest's console, or answers its SSH challenge with no revocations, so
	// they are bcd's and the hypervisor's alone, never a local user's (a holder's confined user).
	for _, p := range []string{r.Console, r.Agent} {
		if p == "" {
			continue
		}
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.opts.Logger.Warn("vps: an instance's socket stays as the hypervisor made it", "instance", in.ID, "path", p, "err", err)
		}
	}
	if in.Reboots > a.state.Reboots[in.ID] && st.State == runtime.StateRunning {
		if err := a.opts.Runtime.Reboot(ctx, in.ID); err != nil {
			return fmt.Errorf("reboot: %w", err)
		}
		a.state.Reboots[in.ID] = in.Reboots
		if err := a.save(); err != nil {
			return err
		}
	}
	a.snapshots(ctx, in, r)
	return nil
}

// snapshots saves the snapshots of an instance the host does not have, removes those no longer
// asked for, and restores one when asked. What fails is kept in snapErrors, for the status.
func (a *Agent) snapshots(ctx context.Context, in hostapi.Instance, r runtime.Instance) {
	errs := a.snapErrors[in.ID]
	if errs == nil {
		errs = map[string]string{}
	}
	keep := map[string]bool{}
	for _, snap := range in.Snapshots {
		if !validID(snap) {
			continue
		}
		keep[snap] = true
		p := a.snapshotPath(in.ID, snap)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if _, failed := errs[snap]; failed {
			continue // tried and failed: not again on every push
		}
		if err := a.opts.Runtime.Save(ctx, in.ID, p); err != nil {
			errs[snap] = err.Error()
			_ = os.Remove(p)
			_ = os.Remove(p + ".disk")
			continue
		}
		a.opts.Logger.Info("vps: snapshot saved", "instance", in.ID, "snapshot", snap)
	}
	for _, snap := range a.snapshotsOf(in.ID) {
		if !keep[snap] {
			p := a.snapshotPath(in.ID, snap)
			_ = os.Remove(p)
			_ = os.Remove(p + ".disk")
		}
	}
	for snap := range errs {
		if !keep[snap] {
			delete(errs, snap)
		}
	}
	if rs := in.Restore; rs != nil && rs.Serial > a.state.Restores[in.ID] {
		p := a.snapshotPath(in.ID, rs.Snapshot)
		if _, err := os.Stat(p); err != nil || !validID(rs.Snapshot) {
			errs[rs.Snapshot] = "restore: the host has no such snapshot of the instance"
		} else if _, err := a.opts.Runtime.Restore(ctx, p, r); err != nil {
			errs[rs.Snapshot] = "restore: " + err.Error()
		} else {
			a.opts.Logger.Info("vps: snapshot restored", "instance", in.ID, "snapshot", rs.Snapshot)
		}
		a.state.Restores[in.ID] = rs.Serial // done, or failed and said so: not tried again
		_ = a.save()
	}
	a.snapErrors[in.ID] = errs
}

// save writes what the agent keeps, atomically.
func (a *Agent) save() error {
	b, err := json.Marshal(a.state)
	if err != nil {
		return err
	}
	tmp := a.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("hostagent: %w", err)
	}
	if err := os.Rename(tmp, a.statePath()); err != nil {
		return fmt.Errorf("hostagent: %w", err)
	}
	return nil
}

func (a *Agent) markDirty() {
	select {
	case a.dirty <- struct{}{}:
	default:
	}
}

// Status is what the host has now: every instance the runtime made, and those it could not
// make, in error, ordered by id.
func (a *Agent) Status(ctx context.Context) (hostapi.Status, error) {
	have, err := a.opts.Runtime.List(ctx)
	if err != nil {
		return hostapi.Status{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := hostapi.Status{Instances: []hostapi.InstanceStatus{}}
	seen := map[string]bool{}
	for _, st := range have {
		s := hostapi.InstanceStatus{ID: st.ID, State: st.State, Detail: st.Detail, Reboots: a.state.Reboots[st.ID],
			Snapshots: a.snapshotsOf(st.ID), Restores: a.state.Restores[st.ID], Ready: a.ready[st.ID]}
		if errs := a.snapErrors[st.ID]; len(errs) > 0 {
			s.SnapshotErrors = maps.Clone(errs)
		}
		if why, ok := a.errored[st.ID]; ok {
			s.State, s.Detail = runtime.StateError, why
		}
		seen[st.ID] = true
		out.Instances = append(out.Instances, s)
	}
	for id, why := range a.errored {
		if !seen[id] {
			out.Instances = append(out.Instances, hostapi.InstanceStatus{ID: id, State: runtime.StateError, Detail: why, Reboots: a.state.Reboots[id]})
		}
	}
	slices.SortFunc(out.Instances, func(x, y hostapi.InstanceStatus) int { return cmp.Compare(x.ID, y.ID) })
	return out, nil
}

// Run reports the host's runtime and whether it answers (vps.host, when the agent starts and
// whenever that changes), and the instances' status after every convergence and every
// StatusEvery, until ctx ends. While the runtime does not answer, the host has no status to
// report and tries the runtime again every RetryEvery: the control plane places no VM on it
// meanwhile, and places them again once it answers. A report that fails is sent again after
// RetryEvery.
func (a *Agent) Run(ctx context.Context) error {
	var told *hostapi.Host // the vps.host the control plane last recorded
	var last []byte        // the status it last recorded
	tick := time.NewTicker(a.opts.StatusEvery)
	defer tick.Stop()
	forced := true
	for {
		st, err := a.Status(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		host := hostapi.Host{Runtime: a.opts.Runtime.Name()}
		if err != nil {
			host.Unreachable = unreachable(err)
		}
		again := err != nil
		if told == nil || *told != host {
			if err := a.opts.Reporter.Report(ctx, hostapi.KindHost, host); err != nil {
				a.opts.Logger.Warn("vps: report the host's runtime", "err", err)
				again = true
			} else {
				switch {
				case host.Unreachable != "":
					a.opts.Logger.Warn("vps: the runtime does not answer: this host takes no VMs until it does", "runtime", host.Runtime, "why", host.Unreachable)
				case told != nil:
					a.opts.Logger.Info("vps: the runtime answers again", "runtime", host.Runtime)
				}
				told = &host
			}
		}
		if err == nil {
			b, _ := json.Marshal(st)
			if forced || string(b) != string(last) {
				if err := a.opts.Reporter.Report(ctx, hostapi.KindStatus, st); err != nil {
					a.opts.Logger.Warn("vps: report the instances' status", "err", err)
					again = true
				} else {
					last = b
				}
			}
		}
		var retry <-chan time.Time
		if again {
			retry = time.After(a.opts.RetryEvery)
		}
		forced = false
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.dirty:
		case <-retry:
		case <-tick.C:
			forced = true
		}
	}
}

// unreachable is why the runtime did not answer, as vps.host carries it.
func unreachable(err error) string {
	why := strings.ToValidUTF8(err.Error(), "?")
	if len(why) > hostapi.MaxUnreachable {
		why = strings.ToValidUTF8(why[:hostapi.MaxUnreachable], "")
	}
	return why
}

// passThrough maps the GPUs an instance holds (their UUIDs, as its reservation names them) to
// what the runtime passes through: the PCI address of a whole GPU, or a MIG device's UUID.
func (a *Agent) passThrough(ctx context.Context, uuids []string) ([]string, error) {
	if a.opts.GPUs == nil {
		return nil, errors.New("this host passes no GPUs through (bcd node read none)")
	}
	byUUID, err := a.opts.GPUs(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the host's GPUs: %w", err)
	}
	out := make([]string, 0, len(uuids))
	for _, u := range uuids {
		if strings.HasPrefix(u, "MIG-") {
			out = append(out, u)
			continue
		}
		addr, ok := byUUID[u]
		if !ok || addr == "" {
			return nil, fmt.Errorf("GPU %s is not on this host (or has no PCI address)", u)
		}
		out = append(out, pciAddress(addr))
	}
	return out, nil
}

// pciAddress writes a PCI address as the runtimes take it: NVML's 00000000:3B:00.0 becomes
// 0000:3b:00.0.
func pciAddress(s string) string {
	s = strings.ToLower(s)
	if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) == 8 {
		s = dom[4:] + ":" + rest
	}
	return s
}
