package chv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The part of cloud-hypervisor's HTTP API (vmm/src/api/openapi/cloud-hypervisor.yaml) that the
// runtime calls, over the VMM's --api-socket.

// apiRoot is where cloud-hypervisor serves its API; the host part of the URL is not used on a
// Unix socket.
const apiRoot = "http://localhost/api/v1/"

// The VM states of the API (schema VmState).
const (
	vmCreated    = "Created"
	vmRunning    = "Running"
	vmShutdown   = "Shutdown"
	vmPaused     = "Paused"
	vmBreakPoint = "BreakPoint"
)

// APIError is an answer of a VMM's API that is not a success: which VM and call, the HTTP status,
// and the messages of the error chain cloud-hypervisor answers with (top error first).
type APIError struct {
	VM       string // the VM's name, bc-<id>
	Call     string // e.g. "PUT vm.boot"
	Status   int
	Messages []string
}

func (e *APIError) Error() string {
	msg := strings.Join(e.Messages, ": ")
	if msg == "" {
		msg = "no message"
	}
	return fmt.Sprintf("cloud-hypervisor %s: %s: %d %s: %s", e.VM, e.Call, e.Status, http.StatusText(e.Status), msg)
}

// notCreated reports whether err is the VMM's answer that it holds no VM (vm.info's 404).
func notCreated(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// vmConfig is the schema VmConfig, with the fields the runtime sets.
type vmConfig struct {
	CPUs    cpusConfig     `json:"cpus"`
	Memory  memoryConfig   `json:"memory"`
	Payload payloadConfig  `json:"payload"`
	Disks   []diskConfig   `json:"disks,omitempty"`
	Net     []netConfig    `json:"net,omitempty"`
	Serial  consoleConfig  `json:"serial"`
	Console consoleConfig  `json:"console"`
	Devices []deviceConfig `json:"devices,omitempty"`
}

// cpusConfig is the schema CpusConfig.
type cpusConfig struct {
	BootVCPUs int `json:"boot_vcpus"`
	MaxVCPUs  int `json:"max_vcpus"`
}

// memoryConfig is the schema MemoryConfig; Size is in bytes.
type memoryConfig struct {
	Size int64 `json:"size"`
}

// payloadConfig is the schema PayloadConfig: a kernel (direct boot) or a firmware.
type payloadConfig struct {
	Firmware  string `json:"firmware,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
}

// diskConfig is the schema DiskConfig.
type diskConfig struct {
	Path         string `json:"path"`
	ImageType    string `json:"image_type,omitempty"` // Qcow2, Raw
	BackingFiles bool   `json:"backing_files,omitempty"`
	Readonly     bool   `json:"readonly,omitempty"`
	ID           string `json:"id,omitempty"`
}

// netConfig is the schema NetConfig: an existing tap device by name and the guest's MAC.
type netConfig struct {
	Tap string `json:"tap"`
	MAC string `json:"mac,omitempty"`
	ID  string `json:"id,omitempty"`
}

// consoleConfig is the schemas SerialConfig and ConsoleConfig (the fields both have).
type consoleConfig struct {
	Mode   string `json:"mode"` // Off, Null, Pty, Tty, File, Socket
	File   string `json:"file,omitempty"`
	Socket string `json:"socket,omitempty"`
}

// deviceConfig is the schema DeviceConfig: a VFIO device by its sysfs path.
type deviceConfig struct {
	Path string `json:"path"`
	ID   string `json:"id,omitempty"`
}

// vmInfo is the schema VmInfo, what the runtime reads of it.
type vmInfo struct {
	State  string          `json:"state"`
	Config json.RawMessage `json:"config"`
}

// pingResponse is the schema VmmPingResponse.
type pingResponse struct {
	Version      string `json:"version"`
	BuildVersion string `json:"build_version"`
	PID          int64  `json:"pid"`
}

// snapshotConfig is the schema VmSnapshotConfig.
type snapshotConfig struct {
	DestinationURL string `json:"destination_url"`
}

// restoreConfig is the schema RestoreConfig.
type restoreConfig struct {
	SourceURL string `json:"source_url"`
}

// client calls one VMM's API on its Unix socket.
type client struct {
	vm      string // for errors
	timeout time.Duration
	http    *http.Client
}

// newClient is a client of the VMM at socket whose calls wait at most timeout for an answer,
// except vm.snapshot and vm.restore, whose time grows with the VM's memory: the caller's
// context bounds those.
func newClient(vm, socket string, timeout time.Duration) *client {
	var d net.Dialer
	return &client{vm: vm, timeout: timeout, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socket)
		},
		// One VMM, few calls, and a VMM that may exit: no connections are kept.
		DisableKeepAlives: true,
	}}}
}

// call sends method op (e.g. PUT vm.boot) with body as JSON (nil: none) and decodes a JSON answer
// into out (nil: none expected).
func (c *client) call(ctx context.Context, method, op string, body, out any) error {
	name := method + " " + op
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("cloud-hypervisor %s: %s: encoding the request: %w", c.vm, name, err)
		}
		rd = bytes.NewReader(b)
	}
	if op != "vm.snapshot" && op != "vm.restore" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("no answer within %v (Options.CallTimeout)", c.timeout))
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, method, apiRoot+op, rd)
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s: %s: %w", c.vm, name, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s: %s: %w", c.vm, name, withCause(ctx, err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("cloud-hypervisor %s: %s: reading the answer: %w", c.vm, name, withCause(ctx, err))
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{VM: c.vm, Call: name, Status: resp.StatusCode, Messages: errorMessages(data)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("cloud-hypervisor %s: %s: the answer (%d, %q) is not what the API describes: %w",
			c.vm, name, resp.StatusCode, truncate(string(data), 200), err)
	}
	return nil
}

// withCause adds why ctx ended to err, when it did: a call that timed out says so. The URL,
// always the same on a Unix socket, is left out.
func withCause(ctx context.Context, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// errorMessages reads an error answer: cloud-hypervisor sends its error chain as a JSON array of
// strings; anything else is kept as text.
func errorMessages(data []byte) []string {
	var msgs []string
	if err := json.Unmarshal(data, &msgs); err == nil {
		return msgs
	}
	if s := strings.TrimSpace(string(data)); s != "" {
		return []string{truncate(s, 500)}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (c *client) ping(ctx context.Context) (pingResponse, error) {
	var p pingResponse
	err := c.call(ctx, http.MethodGet, "vmm.ping", nil, &p)
	return p, err
}

func (c *client) info(ctx context.Context) (vmInfo, error) {
	var info vmInfo
	if err := c.call(ctx, http.MethodGet, "vm.info", nil, &info); err != nil {
		return vmInfo{}, err
	}
	if info.State == "" {
		return vmInfo{}, fmt.Errorf("cloud-hypervisor %s: GET vm.info: the answer has no state", c.vm)
	}
	return info, nil
}

func (c *client) create(ctx context.Context, cfg vmConfig) error {
	return c.call(ctx, http.MethodPut, "vm.create", cfg, nil)
}

// put calls one of the body-less actions: vm.boot, vm.shutdown, vm.reboot, vm.pause, vm.resume,
// vm.delete, vmm.shutdown.
func (c *client) put(ctx context.Context, op string) error {
	return c.call(ctx, http.MethodPut, op, nil, nil)
}

func (c *client) snapshot(ctx context.Context, dir string) error {
	return c.call(ctx, http.MethodPut, "vm.snapshot", snapshotConfig{DestinationURL: "file://" + dir}, nil)
}

func (c *client) restore(ctx context.Context, dir string) error {
	return c.call(ctx, http.MethodPut, "vm.restore", restoreConfig{SourceURL: "file://" + dir}, nil)
}
