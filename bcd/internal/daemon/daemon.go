// Package daemon runs bcd's node mode: the node agent over the journal, the machine's hardware
// (or fake hardware) and the devices converger (MIG, then CDI specs with their cgroup hook),
// writing a status file that `bcd status` reads while the journal is held.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/better-compute/compute/agent/ext"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/bcd/internal/cdi"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/helper"
	"github.com/better-compute/compute/bcd/internal/journal"
	"github.com/better-compute/compute/bcd/internal/mig"
	"github.com/better-compute/compute/bcd/internal/selfupdate"
	"github.com/better-compute/compute/bcd/internal/tenancy"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// Fake describes fake hardware, for tests and demonstrations on machines without GPUs.
type Fake struct {
	GPUs         int           `json:"gpus"`
	Model        string        `json:"model,omitempty"`
	CommandDelay time.Duration `json:"commandDelay,omitempty"`
}

// Config is what bcd node runs with.
type Config struct {
	StateDir string
	CDIDir   string // where device holds become CDI specs; "" for none (a site agent holds no devices)
	Gateway  string // overrides the gateways of the join
	// Transport is how the session reaches the gateway: auto ("": gRPC, else the WebSocket),
	// grpc or websocket (nodeagent.Config.Transport).
	Transport string
	Fake      *Fake // nil: the real machine
	Version   string
	Logger    *slog.Logger
	// Extensions carry out modules' command and desired-state kinds (agent/ext).
	Extensions []ext.Extension
	// Reports, if set, is the queue of the extensions' reports up the session.
	Reports *nodeagent.Reports
	// Exec and Consoles are what holders' tunnels may reach (nodeagent.Config).
	Exec     bool
	Consoles map[string]string
	// Tenancy, if set, confines the holders of part of the node, each to its reservation's own
	// user (bcd/internal/tenancy): it converges after the CDI specs, and runs their commands.
	// Nil: only whole holders' and operators' commands run.
	Tenancy *tenancy.Manager
	// DeviceRoot is where the GPUs' device nodes are; default /dev.
	DeviceRoot string
	// Helper is the socket of the root helper (bcd helper) that writes CDI specs, makes MIG
	// changes and resets GPUs for this agent, which then runs unprivileged; "" does them here.
	Helper string
	// SelfUpdate, if set, lets the control plane update this bcd (the bcd.release part).
	SelfUpdate *SelfUpdate
	// OnHardware, if set, is given the machine once it is open (the vps host agent reads its
	// GPUs' PCI addresses from it).
	OnHardware func(nodeagent.Hardware)
}

// SelfUpdate is how bcd updates itself: into the slots under the state directory, verified
// against the release repository's metadata (kept there too), restarting through Restart.
type SelfUpdate struct {
	Self     string        // this binary
	Root     []byte        // a pinned root of the repository; nil: trust on first use
	Deadline time.Duration // a new binary's trial
	Restart  func(path string)
}

// SlotsOf is the binary slots of a state directory.
func SlotsOf(stateDir string) selfupdate.Slots {
	return selfupdate.Slots{Dir: filepath.Join(stateDir, "slots")}
}

// Status is the status file: the agent's status and what bcd knows of its machine.
type Status struct {
	nodeagent.Status
	PID     int    `json:"pid"`
	Version string `json:"version"`
	// Update is the state of self-update, when it is on.
	Update    *selfupdate.Status `json:"update,omitempty"`
	GPUStatus string             `json:"gpuStatus,omitempty"` // why there are no GPUs, if there are none
	GPUs      int                `json:"gpus"`
	CDIDir    string             `json:"cdiDir"`
	URL       string             `json:"url,omitempty"` // the control plane the node joined
	UpdatedAt time.Time          `json:"updatedAt"`
}

// StatusPath is the status file of a state directory.
func StatusPath(stateDir string) string { return filepath.Join(stateDir, "status.json") }

// Run runs the node until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	j, err := journal.Open(cfg.StateDir)
	if err != nil {
		return err
	}
	defer j.Close()
	id, ok, err := j.Identity()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("this node has not joined: run bcd join --url URL --token TOKEN first")
	}
	var hc *helper.Client
	if cfg.Helper != "" {
		c, hello, err := helper.Dial(cfg.Helper)
		if err != nil {
			return fmt.Errorf("the root helper (--helper %s): %w", cfg.Helper, err)
		}
		defer c.Close()
		hc = c
		cfg.Logger.Info("bcd: privileged actions go through the root helper", "socket", cfg.Helper, "cdiRoots", hello.CDIRoots, "mig", hello.MIG, "reset", hello.Reset, "why", hello.Why)
		hc.NoMIG = !hello.MIG
	}
	hw, migGPUs, closeHW, err := openHardware(cfg, id.NodeName, hc)
	if err != nil {
		return err
	}
	defer closeHW()
	if cfg.OnHardware != nil {
		cfg.OnHardware(hw)
	}
	inv, err := hw.Inventory(ctx)
	if err != nil {
		return fmt.Errorf("read the machine: %w", err)
	}
	host, _ := os.Hostname()
	var conv nodeagent.Converger = &nodeagent.RecordingConverger{} // no devices to hand out: a site agent
	if cfg.CDIDir != "" {
		devices, err := devicesConverger(cfg, inv, migGPUs)
		if hc != nil && err == nil {
			devices.Specs = hc.Specs(cfg.CDIDir)
		}
		if err != nil {
			return err
		}
		conv = devices
	}
	var confine nodeagent.Confiner
	if cfg.Tenancy != nil {
		conv = convergers{conv, cfg.Tenancy}
		confine = cfg.Tenancy
	}
	exts := cfg.Extensions
	var up *selfupdate.Updater
	if su := cfg.SelfUpdate; su != nil {
		up, err = selfupdate.New(selfupdate.Config{Slots: SlotsOf(cfg.StateDir), Version: cfg.Version, Self: su.Self, Identity: j.Identity,
			Gateway: cfg.Gateway, MetadataDir: filepath.Join(cfg.StateDir, "releases"), Root: su.Root, Deadline: su.Deadline,
			Restart: su.Restart, Logger: cfg.Logger})
		if err != nil {
			return err
		}
		exts = append(append([]ext.Extension(nil), exts...), up.Extension())
	}
	a, err := nodeagent.New(nodeagent.Config{
		Store: j, Hardware: hw, Converger: conv, Logger: cfg.Logger, Version: cfg.Version,
		Gateway: cfg.Gateway, Transport: cfg.Transport, Facts: &agentv1.MachineFacts{Hostname: host, MachineId: machineID(), Os: "linux", Arch: runtime.GOARCH, AgentVersion: cfg.Version},
		Extensions: exts, Reports: cfg.Reports, Exec: cfg.Exec, Consoles: cfg.Consoles, Confine: confine,
	})
	if err != nil {
		return err
	}
	write := func() {
		s := Status{Status: a.Status(), PID: os.Getpid(), Version: cfg.Version, GPUStatus: inv.GetGpuStatus(),
			GPUs: len(inv.GetGpus()), CDIDir: cfg.CDIDir, URL: id.URL, UpdatedAt: time.Now()}
		if up != nil {
			st := up.Status()
			s.Update = &st
			if s.Connected {
				up.Connected() // the session is up: a new binary has proved itself
			}
		}
		if s.NodeID == "" {
			s.NodeID, s.NodeName, s.CertNotAfter = id.NodeID, id.NodeName, id.NotAfter
		}
		if err := writeStatus(cfg.StateDir, s); err != nil {
			cfg.Logger.Warn("bcd: write the status file", "error", err)
		}
	}
	// What runs beside the agent ends with it, whether ctx ended or the agent gave up.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			write()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	cfg.Logger.Info("bcd: node running", "node", id.NodeName, "id", id.NodeID, "version", cfg.Version, "gpus", len(inv.GetGpus()), "gpuStatus", inv.GetGpuStatus())
	updated := make(chan struct{})
	go func() {
		defer close(updated)
		if up != nil {
			_ = up.Run(ctx)
		}
	}()
	err = a.Run(ctx)
	stop()
	<-done
	<-updated
	os.Remove(StatusPath(cfg.StateDir))
	return err
}

// openHardware opens the machine (or fakes one) and its MIG, nil where its GPUs cannot be read
// through NVML. With a root helper (hc), MIG changes and GPU resets go through it.
func openHardware(cfg Config, name string, hc *helper.Client) (nodeagent.Hardware, hardware.MIG, func(), error) {
	if cfg.Fake != nil {
		model := cfg.Fake.Model
		if model == "" {
			model = "NVIDIA H100 80GB HBM3"
		}
		hw := nodeagent.NewFakeHardware(name, cfg.Fake.GPUs, model)
		hw.SlowCommands(cfg.Fake.CommandDelay)
		if hc != nil {
			return helperReset{hw, hc}, hc.MIG(), func() {}, nil
		}
		return hw, hardware.NewFakeMIG(cfg.Fake.GPUs), func() {}, nil
	}
	gpus, err := hardware.OpenSystemGPUs()
	if err != nil {
		return nil, nil, nil, err
	}
	closeFn := func() {}
	if c, ok := gpus.(interface{ Close() }); ok {
		closeFn = c.Close
	}
	m, _ := gpus.(hardware.MIG) // NoGPUs has none: never touch NVML after a failed Init
	machine := &hardware.Machine{Host: hardware.Host{Disk: cfg.StateDir}, GPUs: gpus}
	if hc != nil {
		machine.Reset = hc.ResetGPU
		if m != nil {
			m = hc.MIG()
		}
	}
	return machine, m, closeFn, nil
}

// helperReset is fake hardware whose GPU resets go through the root helper too.
type helperReset struct {
	*nodeagent.FakeHardware
	hc *helper.Client
}

func (h helperReset) ResetGPU(ctx context.Context, index int) error {
	if err := h.hc.ResetGPU(ctx, index); err != nil {
		return err
	}
	return h.FakeHardware.ResetGPU(ctx, index)
}

// devicesConverger is the CDI converger with the MIG converger over gpus (if any), its specs'
// cgroup hook running this bcd.
func devicesConverger(cfg Config, inv *agentv1.Inventory, gpus hardware.MIG) (*cdi.Converger, error) {
	c := &cdi.Converger{Dir: cfg.CDIDir, DeviceRoot: cfg.DeviceRoot, Devices: inv.GetGpus, Logger: cfg.Logger}
	if gpus != nil {
		m, err := mig.New(gpus, cfg.Logger)
		if err != nil {
			return nil, err
		}
		c.MIG = m
	}
	// The runtime runs the hook by this path: the binary that runs now, links resolved.
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		cfg.Logger.Warn("bcd: cannot find its own binary: CDI specs get no cgroup hook, and holds' cpusets and memory are not enforced", "error", err)
		return c, nil
	}
	c.Hook = self
	return c, nil
}

// convergers apply a desired state in order, each whatever the others met.
type convergers []nodeagent.Converger

func (cs convergers) Apply(ctx context.Context, ds *agentv1.DesiredState) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Apply(ctx, ds))
	}
	return errors.Join(errs...)
}

func machineID() string {
	for _, p := range []string{"/etc/machine-id", "/var/lib/dbus/machine-id"} {
		if b, err := os.ReadFile(p); err == nil && len(b) > 1 {
			return string(b[:len(b)-1])
		}
	}
	h, _ := os.Hostname()
	return "host-" + h
}

func writeStatus(dir string, s Status) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := StatusPath(dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, StatusPath(dir))
}

// ReadStatus returns what `bcd status` shows: the status file of a running node, or else what
// the journal holds (the node is not running).
func ReadStatus(stateDir string) (Status, bool, error) {
	var s Status
	if b, err := os.ReadFile(StatusPath(stateDir)); err == nil && json.Unmarshal(b, &s) == nil &&
		time.Since(s.UpdatedAt) < 10*time.Second && alive(s.PID) {
		return s, true, nil
	}
	j, err := journal.OpenReadOnly(stateDir)
	if err != nil {
		return s, false, err
	}
	defer j.Close()
	id, ok, err := j.Identity()
	if err != nil {
		return s, false, err
	}
	if !ok {
		return s, false, errors.New("this node has not joined: run bcd join")
	}
	ds, applied, _ := j.Desired()
	results, _ := j.Results()
	s = Status{Status: nodeagent.Status{NodeID: id.NodeID, NodeName: id.NodeName, AppliedGeneration: applied,
		Holds: len(ds.GetHolds()), PendingResults: len(results), CertNotAfter: id.NotAfter}}
	return s, false, nil
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}
