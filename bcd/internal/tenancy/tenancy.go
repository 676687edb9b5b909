// Package tenancy confines the holders of part of a node, each to its reservation, so that
// tenants sharing a node cannot reach each other (docs/security.md, "Tenants sharing a node"):
//
//   - a user of its own (api.ReservationUser, "bc-…"), unprivileged, made while the
//     reservation holds the node and removed, with its processes, home and temporary files,
//     once the hold ends; its commands (access.exec) and SSH logins run as it;
//   - a home of its own (Options.Home/<user>, mode 0700), the commands' working directory;
//   - a cgroup of its own where cgroup v2 is mounted (<cgroup2>/better-compute-holders/<user>),
//     with the hold's cpuset and memory where those controllers are available, into which its
//     commands are started;
//   - only its own GPUs: every GPU device node (and MIG capability node) belongs to root and
//     to a group of its own (bc-dev-<name>, mode 0660) whose members are the users of the
//     holds whose CDI spec names it, so that the others' cannot be opened.
//
// A holder of the whole node runs as the user bcd runs as (the control plane decides, per
// tunnel); this package is not involved. It needs root: bcd node makes a Manager only when it
// runs as root, and refuses partial holders' commands otherwise.
package tenancy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"

	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
)

// Defaults of Options.
const (
	DefaultHome       = "/home"
	DefaultDeviceRoot = "/dev"
	// CgroupParent is the cgroup, under the cgroup2 mount, of the holders' cgroups.
	CgroupParent = "better-compute-holders"
	stateFile    = "tenancy.json"
)

// Options configure a Manager. Zero values mean the defaults.
type Options struct {
	// StateDir keeps tenancy.json: the users and groups this package made, so that it removes
	// only its own. Required.
	StateDir string
	// Home is where each holder's home is made, as Home/<user>; default DefaultHome.
	Home string
	// DeviceRoot is where the GPUs' device nodes are; default DefaultDeviceRoot. It must be the
	// CDI converger's (cdi.Converger.DeviceRoot).
	DeviceRoot string
	// CDIDir is where the CDI converger writes each hold's spec: its device nodes are the
	// hold's. Required.
	CDIDir string
	// Cgroup is where cgroup v2 is mounted; "" finds it in /proc/self/mountinfo. Where there is
	// none, holders get no cgroup of their own.
	Cgroup string
	Logger *slog.Logger
}

// Manager keeps the holders' confinement as the node's desired state says.
type Manager struct {
	opts   Options
	log    *slog.Logger
	cgroup string // the cgroup2 mount, or ""

	mu    sync.Mutex
	state state
}

// state is what the Manager made, persisted in StateDir.
type state struct {
	Users  map[string]*holder `json:"users"`  // by reservation
	Groups []string           `json:"groups"` // the device groups it made
	// NextID is the next uid or gid to give a holder's user or a device's group: ids are never
	// given twice, so nothing a holder left (a file it owns, a setgid file of a GPU's group) is
	// ever anyone else's.
	NextID int `json:"nextId,omitempty"`
	// Members are each device group's members as last set (userdel takes a removed user out of
	// /etc/group, so the file cannot say who left).
	Members map[string][]string `json:"members,omitempty"`
}

// FirstID is where the ids of holders' users and devices' groups start: far above the ids a
// distribution gives its users, below 2^31 (which some tools take for negative).
const FirstID = 1_500_000_000

// freshID is an id (uid and gid) never given before by this Manager, and free now.
func (m *Manager) freshID() (int, error) {
	for id := max(m.state.NextID, FirstID); id < 1<<31-1; id++ {
		_, uerr := user.LookupId(strconv.Itoa(id))
		_, gerr := user.LookupGroupId(strconv.Itoa(id))
		if uerr != nil && gerr != nil {
			m.state.NextID = id + 1
			return id, m.save()
		}
	}
	return 0, errors.New("tenancy: no free id left")
}

// holder is a reservation's confinement.
type holder struct {
	User string `json:"user"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	Home string `json:"home"`
	// Groups are the gids of the device groups of its GPUs; Env the CDI spec's environment
	// (NVIDIA_VISIBLE_DEVICES…), both as of the last Apply.
	Groups []uint32 `json:"groups,omitempty"`
	Env    []string `json:"env,omitempty"`
}

// New checks that the process runs as root and that the tools it uses are there, and reads
// what it made before.
func New(opts Options) (*Manager, error) {
	switch {
	case opts.StateDir == "" || opts.CDIDir == "":
		return nil, errors.New("tenancy: a state directory and the CDI directory are required")
	case os.Geteuid() != 0:
		return nil, errors.New("tenancy: making holders' users needs root")
	}
	opts.Home = cmp.Or(opts.Home, DefaultHome)
	opts.DeviceRoot = cmp.Or(opts.DeviceRoot, DefaultDeviceRoot)
	if !filepath.IsAbs(opts.Home) || !filepath.IsAbs(opts.DeviceRoot) {
		return nil, fmt.Errorf("tenancy: the home directory %q and the device root %q must be absolute", opts.Home, opts.DeviceRoot)
	}
	for _, tool := range tools {
		if _, err := lookTool(tool); err != nil {
			return nil, fmt.Errorf("tenancy: %s is needed to make holders' users (Debian package passwd): %w", tool, err)
		}
	}
	m := &Manager{opts: opts, log: cmp.Or(opts.Logger, slog.Default()), state: state{Users: map[string]*holder{}}}
	b, err := os.ReadFile(filepath.Join(opts.StateDir, stateFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("tenancy: %w", err)
	default:
		if err := json.Unmarshal(b, &m.state); err != nil {
			return nil, fmt.Errorf("tenancy: %s is damaged: %w", filepath.Join(opts.StateDir, stateFile), err)
		}
		if m.state.Users == nil {
			m.state.Users = map[string]*holder{}
		}
	}
	m.cgroup = opts.Cgroup
	if m.cgroup == "" {
		m.cgroup = findCgroup2()
	}
	if m.cgroup == "" {
		m.log.Warn("tenancy: no cgroup v2 is mounted: holders' commands get no cgroup of their own (their processes are still theirs alone, by user)")
	}
	return m, nil
}

func (m *Manager) save() error {
	b, err := json.MarshalIndent(m.state, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(m.opts.StateDir, stateFile)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("tenancy: %w", err)
	}
	return os.Rename(p+".tmp", p)
}

// reservationRE is what a holder (a reservation id) may look like: it names a user's comment,
// a file and a cgroup.
var reservationRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)

// Apply converges the holders' confinement on ds's holds (run after the CDI converger, whose
// specs say each hold's device nodes): a user, home and cgroup for each hold, the device
// nodes' groups, and the removal of every confinement whose hold ended.
func (m *Manager) Apply(ctx context.Context, ds *agentv1.DesiredState) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	want := map[string]*agentv1.DeviceHold{}
	for _, h := range ds.GetHolds() {
		if !reservationRE.MatchString(h.GetHolder()) {
			errs = append(errs, fmt.Errorf("tenancy: holder %q is not a reservation id", h.GetHolder()))
			continue
		}
		want[h.GetHolder()] = h
	}
	// The ended first: their users leave the device groups before the new members are set.
	for res := range m.state.Users {
		if want[res] == nil {
			if err := m.remove(ctx, res); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, res := range slices.Sorted(maps.Keys(want)) {
		if err := m.ensure(ctx, res, want[res]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.devices(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := m.save(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// UserOf returns the user a reservation's SSH logins and commands run as, once made.
func (m *Manager) UserOf(reservation string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.state.Users[reservation]
	if h == nil {
		return "", false
	}
	return h.User, true
}

// userName is the user of a reservation: the control plane's name for it.
func userName(reservation string) string { return api.ReservationUser(reservation) }
