package selfupdate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// Defaults of an Updater.
const (
	// DefaultDeadline is how long a new binary has to reach its gateway before it is rolled back.
	DefaultDeadline = 2 * time.Minute
	// MaxBoots is how many times a new binary may start during its trial (restarted by its unit
	// after a crash, say) before a start rolls it back.
	MaxBoots = 3
	retryMin = 5 * time.Second
	retryMax = 5 * time.Minute
)

// Config configures an Updater.
type Config struct {
	Slots   Slots
	Version string // of the bcd running
	Self    string // its binary (os.Executable)
	// Identity reads the node's identity (the journal's): its certificate reaches the gateway.
	Identity func() (nodeagent.Identity, bool, error)
	Gateway  string // overrides the identity's gateways
	// MetadataDir keeps the repository's trusted metadata; Root, if set, is the pinned root.
	MetadataDir string
	Root        []byte
	// Deadline is a new binary's trial; default DefaultDeadline.
	Deadline time.Duration
	// Restart asks the process to stop and exec path (the binary of the slot switched to).
	Restart func(path string)
	Logger  *slog.Logger
}

// Updater is bcd's side of the bcd.release desired-state part: it installs the release the
// control plane names into the inactive slot, verified through the repository's TUF metadata,
// switches to it and restarts into it; in the new binary it ends the trial once the session is
// up, or rolls back when the deadline passes first.
type Updater struct {
	cfg  Config
	slot string // the slot this binary runs from, "" for none
	wake chan struct{}

	mu     sync.Mutex
	wanted *api.BCDRelease
	status Status
}

// Status is what `bcd status` shows of updates.
type Status struct {
	Wanted       string    `json:"wanted,omitempty"`  // a release being installed
	Error        string    `json:"error,omitempty"`   // why the last attempt failed
	Refused      string    `json:"refused,omitempty"` // a release this node rolled back, named again
	Trial        *Trial    `json:"trial,omitempty"`
	LastRollback *Rollback `json:"lastRollback,omitempty"`
}

// New returns an updater; Run runs it.
func New(cfg Config) (*Updater, error) {
	if cfg.Identity == nil || cfg.Restart == nil || cfg.Slots.Dir == "" || cfg.MetadataDir == "" {
		return nil, errors.New("selfupdate: an updater needs slots, a metadata directory, the node's identity and a restart")
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = DefaultDeadline
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Updater{cfg: cfg, slot: cfg.Slots.SlotOf(cfg.Self), wake: make(chan struct{}, 1)}, nil
}

// Extension converges the bcd.release part.
func (u *Updater) Extension() ext.Extension {
	return ext.Extension{Name: "bcd-release", Desired: map[string]ext.Converger{api.BCDReleaseKind: u.apply}}
}

// Status returns the updater's state.
func (u *Updater) Status() Status {
	u.mu.Lock()
	s := u.status
	u.mu.Unlock()
	s.Trial, _ = u.cfg.Slots.Trial()
	s.LastRollback, _ = u.cfg.Slots.LastRollback()
	return s
}

// tryKey names a try of a release: a node does not install again a release it rolled back in
// the same try.
func tryKey(r api.BCDRelease) string { return fmt.Sprintf("%s/%s#%d", r.Version, r.Rollout, r.Attempt) }

// apply takes a push of the part: it only records what is wanted (the install runs in Run, not
// in the session's loop), or says that this release was rolled back here.
func (u *Updater) apply(_ context.Context, version uint32, payload []byte) error {
	if payload == nil {
		u.want(nil)
		return nil
	}
	if version != api.BCDReleaseVersion {
		return fmt.Errorf("bcd.release version %d: this bcd knows version %d", version, api.BCDReleaseVersion)
	}
	var r api.BCDRelease
	if err := json.Unmarshal(payload, &r); err != nil {
		return fmt.Errorf("bcd.release: %w", err)
	}
	if !tufrepo.ValidVersion(r.Version) {
		return fmt.Errorf("bcd.release: %q is not a release version", r.Version)
	}
	if r.Version == u.cfg.Version {
		u.want(nil)
		return nil
	}
	if rb, err := u.cfg.Slots.LastRollback(); err == nil && rb != nil && rb.Try == tryKey(r) {
		// Not an error of the state: that would hold back the parts after this one (a module's
		// instances) for as long as the rollout names this release. The rollout sees the node
		// stay on its version; bcd status says why.
		u.want(nil)
		refused := fmt.Sprintf("bcd %s was installed and rolled back at %s (%s); this node stays on %s until it is tried again",
			r.Version, rb.At.Format(time.RFC3339), rb.Reason, u.cfg.Version)
		u.mu.Lock()
		first := u.status.Refused != refused
		u.status.Refused = refused
		u.mu.Unlock()
		if first {
			u.cfg.Logger.Warn("bcd: " + refused)
		}
		return nil
	}
	u.want(&r)
	return nil
}

func (u *Updater) want(r *api.BCDRelease) {
	u.mu.Lock()
	u.wanted = r
	u.status.Refused = ""
	if r == nil {
		u.status.Wanted, u.status.Error = "", ""
	} else {
		u.status.Wanted = r.Version
	}
	u.mu.Unlock()
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// Connected is called while the node's session is up: it ends this binary's trial.
func (u *Updater) Connected() {
	if u.slot == "" {
		return
	}
	if ok, err := u.cfg.Slots.Commit(u.slot); err != nil {
		u.cfg.Logger.Error("bcd: end the update's trial", "error", err)
	} else if ok {
		u.cfg.Logger.Info("bcd: the update reached its gateway; it stays", "version", u.cfg.Version, "slot", u.slot)
	}
}

// Run installs what is wanted until ctx ends, retrying with backoff; during this binary's own
// trial it rolls back once the deadline passes without a session.
func (u *Updater) Run(ctx context.Context) error {
	var deadline <-chan time.Time
	if t, err := u.cfg.Slots.Trial(); err == nil && t != nil && t.Slot == u.slot {
		timer := time.NewTimer(time.Until(t.Deadline))
		defer timer.Stop()
		deadline = timer.C
	}
	var retry <-chan time.Time
	backoff := retryMin
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			deadline = nil
			if t, err := u.cfg.Slots.Rollback(fmt.Sprintf("it did not reach its gateway within %s", u.cfg.Deadline)); err != nil {
				u.cfg.Logger.Error("bcd: roll the update back", "error", err)
			} else if t != nil {
				u.cfg.Logger.Error("bcd: this update did not reach its gateway in time; rolling back", "version", t.Version, "to", t.PreviousVersion)
				u.cfg.Restart(u.cfg.Slots.Path(t.Previous))
				return nil
			}
			continue
		case <-u.wake:
		case <-retry:
		}
		retry = nil
		u.mu.Lock()
		r := u.wanted
		u.mu.Unlock()
		if r == nil {
			backoff = retryMin
			continue
		}
		path, err := u.install(ctx, *r)
		if err == nil {
			u.cfg.Logger.Info("bcd: installed a release; restarting into it", "version", r.Version, "path", path)
			u.cfg.Restart(path)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		u.mu.Lock()
		u.status.Error = err.Error()
		u.mu.Unlock()
		u.cfg.Logger.Error("bcd: install a release", "version", r.Version, "error", err, "retry in", backoff)
		retry = time.After(backoff)
		backoff = min(backoff*2, retryMax)
	}
}

// install fetches and verifies r's build into the inactive slot and switches to it, on trial.
// It returns the binary to restart into.
func (u *Updater) install(ctx context.Context, r api.BCDRelease) (string, error) {
	if t, err := u.cfg.Slots.Trial(); err != nil {
		return "", err
	} else if t != nil {
		return "", fmt.Errorf("the update to %s is still on trial: it must reach its gateway first", t.Version)
	}
	id, ok, err := u.cfg.Identity()
	if err != nil || !ok {
		return "", fmt.Errorf("the node's identity: %v", err)
	}
	hc, err := nodeagent.GatewayHTTP(id)
	if err != nil {
		return "", err
	}
	addr := nodeagent.GatewayAddress(id, u.cfg.Gateway)
	if addr == "" {
		return "", errors.New("no gateway address")
	}
	if err := u.cfg.Slots.Seed(u.cfg.Self); err != nil {
		return "", err
	}
	cur, _, err := u.cfg.Slots.Current()
	if err != nil {
		return "", err
	}
	next := Other(cur)
	c := &tufrepo.Client{BaseURL: "https://" + addr, HTTP: hc, Dir: u.cfg.MetadataDir, Root: u.cfg.Root}
	if err := mkdirSlot(u.cfg.Slots, next); err != nil {
		return "", err
	}
	if _, err := c.Fetch(ctx, tufrepo.Build{Version: r.Version, OS: runtime.GOOS, Arch: runtime.GOARCH}, u.cfg.Slots.Path(next)); err != nil {
		return "", err
	}
	now := time.Now().UTC()
	t := Trial{Slot: next, Previous: cur, Version: r.Version, PreviousVersion: u.cfg.Version, Try: tryKey(r), Started: now, Deadline: now.Add(u.cfg.Deadline)}
	if err := u.cfg.Slots.Begin(t); err != nil {
		return "", err
	}
	return u.cfg.Slots.Path(next), nil
}
